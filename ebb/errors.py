"""One error taxonomy for the platform: client, capacity, job and weights errors.

Each error knows its HTTP status, its OpenAI error `type`, a machine-readable `code` and
whether retrying the same call later can succeed. The frontdoor turns any `EbbError` into
the OpenAI error shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations


class EbbError(Exception):
    status_code: int = 500
    error_type: str = "server_error"
    code: str = "internal_error"
    retryable: bool = False

    # Set by the frontdoor once a request id exists, so a refusal can be traced.
    request_id: str | None = None
    # The deployment version admission picked, when one was (sent as x-ebb-version).
    version: int = 0

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


# --- client errors: the caller must change the request -------------------------------


class InvalidRequest(EbbError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(EbbError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(EbbError):
    status_code = 403
    error_type = "permission_error"
    code = "permission_denied"


class QuotaExceeded(PermissionDenied):
    """A tenant's change would pass a quota the admin set. 403, not 429: waiting does not
    help (and clients retry a 429 by themselves); deleting something or a raised quota does."""

    code = "quota_exceeded"


class NotFound(EbbError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Conflict(EbbError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"


class RateLimited(EbbError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class InsufficientQuota(EbbError):
    """429 past a spend cap (a budget), shaped as OpenAI's own `insufficient_quota`: not
    retryable, as waiting helps only once the budget's period resets or it is raised (the
    frontdoor sends `x-should-retry: false`, which OpenAI's clients obey)."""

    status_code = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


# --- capacity errors: the platform could not take the work now -----------------------


class CapacityError(EbbError):
    """503: no work was done and nothing is billed; `retry_after_s` is an honest estimate."""

    status_code = 503
    error_type = "server_error"
    code = "capacity_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


# --- errors while running accepted work ------------------------------------------------


class JobError(EbbError):
    status_code = 500
    error_type = "server_error"
    code = "job_failed"


class RequestTimeout(EbbError):
    """504: the request ran past its deployment's wall-clock limit and was stopped."""

    status_code = 504
    error_type = "server_error"
    code = "request_timeout"


# --- weights -------------------------------------------------------------------------


class WeightsError(EbbError):
    status_code = 502
    error_type = "server_error"
    code = "weights_error"


class WeightsNotFound(WeightsError):
    code = "weights_not_found"


class WeightsAuthError(WeightsError):
    code = "weights_auth_error"


class WeightsTransientError(WeightsError):
    code = "weights_transient_error"
    retryable = True


class WeightsCorrupt(WeightsError):
    code = "weights_corrupt"
    retryable = True
