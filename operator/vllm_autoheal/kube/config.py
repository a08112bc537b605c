"""OperatorConfig: the operator's settings, built once by the CLI and handed to handlers in kopf's memo."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .resources import DEFAULT_OPERATOR_IMAGE


@dataclass(frozen=True)
class OperatorConfig:
    operator_image: str = DEFAULT_OPERATOR_IMAGE  # the init container that copies the launcher
    heal_enabled: bool = True  # the chart's cluster-wide switch (heal.enabled)
    write_attempts: int = 4  # tries of one write on a conflict or a transient error, one after another
    retry_delay_s: float = 10.0  # kopf.TemporaryError delay; later re-checks of a heal
    request_timeout_s: float = 30.0  # one API request

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        """The chart passes its values as environment variables; only the CLI reads them."""
        env = os.environ if env is None else env
        fields: dict[str, object] = {"heal_enabled": env.get("AUTOHEAL_HEAL_ENABLED", "true").lower() != "false"}
        if env.get("AUTOHEAL_OPERATOR_IMAGE"):
            fields["operator_image"] = env["AUTOHEAL_OPERATOR_IMAGE"]
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)  # type: ignore[arg-type]
