"""What every request parser of the server shares: OpenAI's error and the checks of plain fields."""

from typing import Any


class OpenAIError(Exception):
    """An error response: HTTP status, message, and OpenAI's param / code / type fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def flag(body: dict, name: str, default: bool) -> bool:
    """A boolean field (left out or null: `default`); a 400 naming it otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIError(400, f"{name} must be a boolean, got {value!r}", param=name)
    return value


def given(body: dict, name: str, default: Any) -> Any:
    """A field's value; left out or null: `default`."""
    value = body.get(name)
    return default if value is None else value


def type_name(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
