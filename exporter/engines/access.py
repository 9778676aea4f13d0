"""Request access lines: the family every serving engine prints once per request.

No I/O, no code paths: ``exporter.core.classify`` counts a line of this family as request
traffic (class ``benign``: known, never notable, never start-up progress) and recognises it
by one screen, without the rest of the classifier. Each pattern names a web server's access
line shape, not one engine's wording; all of them must compile in RE2 as well as ``re``.
"""

from __future__ import annotations

from typing import Final

from exporter.engines.profile import LogPattern, benign

_METHOD: Final = r"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)"

#: Request access lines of the servers engines embed.
ACCESS: Final[tuple[LogPattern, ...]] = (
    # issue 29; sglang-04-ready, lmdeploy-01-ready: uvicorn (vLLM, SGLang, LMDeploy) and
    # actix/axum loggers: '127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    benign(rf'"{_METHOD} /\S* HTTP/\d(?:\.\d)?" \d{{3}}\b'),
    # issue 29; ollama-02-ready: GIN (Ollama):
    # '[GIN] 2024/05/01 - 12:00:00 | 200 |  1.2ms | 127.0.0.1 | POST "/api/chat"'
    benign(rf"^\[GIN\] .*\| +\d{{3}} \|.*\| +{_METHOD} +\"/"),
    # issue 29; llamacpp-02-ready: llama.cpp's server:
    # 'srv  log_server_r: request: POST /completion 127.0.0.1 200'
    benign(rf"\blog_server_r: (?:request: )?{_METHOD} /"),
)
