# The operator image. Its init container role: the launcher package lives at a fixed path,
# /opt/vllm-autoheal/vllm_autoheal, which VLLMService pods copy into their vLLM container.
FROM python:3.12.8-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12.8-slim-bookworm
RUN groupadd --gid 10001 autoheal && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin autoheal
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && mkdir -p /opt/vllm-autoheal \
 && cp -r "$(python -c 'import vllm_autoheal, os; print(os.path.dirname(vllm_autoheal.__file__))')" /opt/vllm-autoheal/
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["vllm-autoheal"]
CMD ["operator"]
