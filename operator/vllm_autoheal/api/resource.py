"""The VLLMService custom resource: its group, version and names, and the whole object."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .schema import Model
from .spec import VLLMServiceSpec
from .status import VLLMServiceStatus

GROUP = "vllm.autoheal.dev"
VERSION = "v1alpha1"
KIND = "VLLMService"
PLURAL = "vllmservices"
SINGULAR = "vllmservice"
SHORT_NAMES = ["vllmsvc", "vsvc"]


class VLLMService(Model):
    api_version: str = Field(f"{GROUP}/{VERSION}")
    kind: str = Field(KIND)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VLLMServiceSpec
    status: VLLMServiceStatus = Field(default_factory=VLLMServiceStatus)
