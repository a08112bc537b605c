"""Helpers for the crafted-log tests: a real vLLM log with a client's text put into it must be
diagnosed as the real log is, and the client's words must appear nowhere in the diagnosis.

- `bases`: the real logs crafted logs build on (corpus, vLLM CPU runs, frozen bases), the client's
  marker and payloads, vLLM's line shape, and a timing helper.
- `checks`: classifying a log and comparing a crafted log's diagnosis with the real one's.
- `request_logging`: vLLM's request and response logger, access lines, and engine lines that carry a
  request id or another client value.
- `exceptions`: logged exceptions whose message holds a client's text (templates, LoRA adapters, the
  Hub, the Anthropic API), workers' tracebacks, and every such shape in one table.
- `wrappers`: headers of the servers that wrap vLLM (Triton, KServe, glog).
- `records`: vLLM's JSON log records and vLLM's text lines reprinted under other logging formats.
- `node_logs`: the node's log files (CRI, docker json-file), collectors' prefixes, and a kubelet's
  log endpoint.
- `reports`: uvicorn's request reports, headed request reports, forged headers, serving stats.
- `grammar`: the structured-output grammar crash, in text and JSON logging.
"""
