"""The server's request limits and refusals, below both the request schemas and the policy that
applies them (so neither imports the other): :class:`RequestError`, the keys no request may carry,
the sampling ranges a request may set.
"""

from __future__ import annotations

from typing import Any

#: Keys that would choose an endpoint or a credential: refused wherever they appear in a request.
ENDPOINT_KEYS = frozenset({"baseurl", "apibase", "apikey", "openaiapikey", "openaiapibase", "endpoint", "apiurl"})


#: The sampling values a request may set (a spec's or a preset's): OpenAI's temperature range, and
#: seeds every backend takes (llama.cpp's are 32-bit).
TEMPERATURE_RANGE = (0.0, 2.0)
SEED_RANGE = (0, 2**31 - 1)


class RequestError(ValueError):
    """A refused request: ``message`` names the problem and the fix; ``param`` the field.
    ``should_retry``: sent as ``x-should-retry`` (the header the OpenAI SDKs read before their own
    rule, which retries every 408, 409, 429 and 5xx): False where a retry could only repeat the
    failure at the same cost (a debate that failed or timed out); None leaves it to the client."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.should_retry = should_retry

    def renamed(self, fields: dict[str, str], prefix: str) -> RequestError:
        """The same refusal for a request that holds these fields elsewhere: ``param`` (and the message
        that starts with it) renamed by ``fields``, else under ``prefix`` (the chat endpoint's ``moot``)."""
        if self.param is None:
            return self
        head, _, rest = self.param.partition(".")
        param = fields[head] + (f".{rest}" if rest else "") if head in fields else f"{prefix}.{self.param}"
        message = self.message
        if message.startswith(f"{self.param}:"):
            message = param + message[len(self.param) :]
        return RequestError(message, param=param, status=self.status, code=self.code, should_retry=self.should_retry)


def refuse_endpoints(data: Any, where: str = "") -> None:
    """Refuse any key that names an endpoint or a key (``base_url``, ``api_key``, ...), at any depth."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{where}.{key}" if where else str(key)
            if str(key).replace("_", "").replace("-", "").lower() in ENDPOINT_KEYS:
                raise RequestError(
                    f"{path}: a request cannot choose an endpoint or a credential; the server's operator sets "
                    "them (see GET /v1/models for the models this server offers)",
                    param=path,
                )
            refuse_endpoints(value, path)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            refuse_endpoints(value, f"{where}[{i}]")
