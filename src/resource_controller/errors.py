"""Every error the project raises, under ``RcError``, whose ``code`` and ``status`` are
the wire's (API-090); the client's ``ApiError`` for a code is also that code's class, so
``except NotJobOwner`` works on both sides. A class docstring is its default message.
"""

from __future__ import annotations


class RcError(Exception):
    """Something went wrong."""

    code = "store_error"
    status = 500

    def __init_subclass__(cls, code: str = "", status: int = 0) -> None:
        """``class NotFound(RcError, code="not_found", status=404)``: the wire's pair."""
        super().__init_subclass__()
        if code:
            cls.code = code
        if status:
            cls.status = status

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        super().__init__(self.message)


class StoreError(RcError):
    """The database failed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached now; another controller, or a retry, may answer."""


class ConnectionDropped(StoreUnavailable):
    """The database connection dropped before the operation committed: it may run again."""


class NotFound(RcError, code="not_found", status=404):
    """Not found."""


class JobNotFound(NotFound):
    """No such job."""


class ArrayNotFound(NotFound):
    """No such array (EXT-ARRAY-3)."""


class DeviceNotFound(NotFound):
    """No such device."""

    # One error for every unknown device ID; retire alone answers ``device_not_found``.

    def __init__(self, message: str | None = None, code: str = "not_found") -> None:
        super().__init__(message)
        self.code = code


class RetiredDeviceNotFound(DeviceNotFound, code="device_not_found"):
    """No such device (retire)."""

    def __init__(self, message: str | None = None, code: str = "device_not_found") -> None:
        super().__init__(message, code)


class WorkerNotFound(NotFound):
    """No such worker."""


class BadRequest(RcError, code="bad_request", status=400):
    """The request is malformed."""


class InvalidTransition(BadRequest):
    """That state change is not allowed from the current state."""


class BadSelector(RcError, code="bad_selector", status=400):
    """The selector does not parse."""


class PriorityOutOfRange(RcError, code="priority_out_of_range", status=400):
    """Priority must be between -10 and 10."""


class UnknownDevice(RcError, code="unknown_device", status=400):
    """No worker ever registered that device."""


class NoMatchingDevice(RcError, code="no_matching_device", status=400):
    """The selector matches no device."""


class RuntimeAboveCeiling(RcError, code="runtime_above_ceiling", status=400):
    """The requested runtime is above the device's ceiling."""


class LogsNotStored(RcError, code="logs_not_stored", status=400):
    """Logs are not stored for attached (tty/pipe) jobs."""


class NotJobOwner(RcError, code="not_job_owner", status=403):
    """Only the job's submitter (or an admin) may do that."""


class Unauthorized(RcError, code="unauthorized", status=401):
    """The token is missing, malformed or unknown."""


class Forbidden(RcError, code="forbidden", status=403):
    """The token's role may not do that."""


class NotThisHost(Forbidden):
    """A named worker token speaks only for the host of its name."""


class NoDeviceAvailable(RcError, code="no_device_available", status=409):
    """Nothing matching is free: the device is busy and the job could not be queued."""


class NotCancellable(RcError, code="not_cancellable", status=409):
    """The job cannot be cancelled."""


class DeviceNotCleared(RcError, code="device_not_cleared", status=409):
    """The device was not cleared: it is not quarantined, or a live lease holds it."""


class DeviceBusy(RcError, code="device_busy", status=409):
    """A live lease holds the device: kill or release it first."""


class Conflict(RcError, code="conflict", status=409):
    """That half of the relay session already has a client."""


class Unsupported(RcError, code="unsupported", status=500):
    """The server cannot stream (or cannot stream full-duplex) on this connection."""


class LiveLeaseConflict(RcError):
    """The one-live-lease-per-device index refused a second lease."""


class NotLeading(RcError):
    """This controller no longer leads: nothing was written."""


class ClientError(RcError):
    """The client library failed."""


class ApiError(ClientError):
    """The controller answered with an error."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message


class TransportError(ClientError):
    """The controller could not be reached."""


class ConnectFailed(TransportError):
    """The connection was never made (refused, no such host, TLS, connect bound): the
    request was not sent, so another controller may take it."""


class Disconnected(TransportError):
    """The request went out and the connection closed or reset before any answer: on an
    idle kept-alive connection, the server had closed it; elsewhere it may have acted."""


class AnswerLost(TransportError):
    """The answer broke off midway, or was not HTTP/1.1 that can be read."""


class TimedOut(TransportError):
    """No answer within the caller's bound."""


class Refused(TransportError):
    """A relay stream's controller answered, but not ``200``: ``status``, ``reason``,
    and the spec's error body as ``code`` and ``detail`` when it carried one."""

    def __init__(self, status: int, reason: str, code: str, detail: str) -> None:
        self.status = status
        self.reason = reason
        self.code = code
        self.detail = detail
        super().__init__(f"controller returned {self.status_line}")

    @property
    def status_line(self) -> str:
        return f"{self.status} {self.reason}".strip()

    def describe(self) -> str:
        """``code: message`` when the answer carried the spec's error body."""
        if self.code:
            return f"{self.code}: {self.detail}" if self.detail else self.code
        return str(self)


class NoDeviceError(ClientError, NoDeviceAvailable):
    """Submit refused with 409: nothing matching is free (``no_device_available``)."""


class NotCancellableError(ClientError, NotCancellable):
    """Job not cancellable."""


class DeviceHeldByAnother(ClientError):
    """``rc cp``: the device is held, or was taken before the copy job could start."""


class StaleLease(RcError, code="stale_lease", status=409):
    """The report names a lease epoch that is no longer the job's current one."""


class LogError(RcError, code="log_error", status=500):
    """The log could not be written."""


class TooLarge(RcError, code="body_too_large", status=413):
    """The request body is too large."""

    def __init__(self, message: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or type(self).code


class ChunkTooLarge(TooLarge, code="chunk_too_large"):
    """The log chunk is too large."""


class SheetTooLarge(TooLarge, code="sheet_too_large"):
    """The usage sheet is too large."""


#: Every machine code the controller sends (API-090, with EXT-EPOCH-3's ``stale_lease``)
#: and the class that stands for it, so a caller catches a code by type.
API_CODES: dict[str, type[RcError]] = {
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "bad_request": BadRequest,
    "priority_out_of_range": PriorityOutOfRange,
    "bad_selector": BadSelector,
    "runtime_above_ceiling": RuntimeAboveCeiling,
    "unknown_device": UnknownDevice,
    "no_matching_device": NoMatchingDevice,
    "logs_not_stored": LogsNotStored,
    "not_job_owner": NotJobOwner,
    "not_found": NotFound,
    "device_not_found": RetiredDeviceNotFound,
    "no_device_available": NoDeviceAvailable,
    "not_cancellable": NotCancellable,
    "device_not_cleared": DeviceNotCleared,
    "device_busy": DeviceBusy,
    "conflict": Conflict,
    "stale_lease": StaleLease,
    "sheet_too_large": SheetTooLarge,
    "body_too_large": TooLarge,
    "chunk_too_large": ChunkTooLarge,
    "store_error": StoreError,
    "log_error": LogError,
    "unsupported": Unsupported,
}

_API_CLASSES: dict[str, type[ApiError]] = {}


def api_error_class(code: str) -> type[ApiError]:
    """The client-side class for ``code``, made once: an ``ApiError`` that is also the
    code's class; a plain ``ApiError`` for a code this client does not know."""
    cls = _API_CLASSES.get(code)
    if cls is None:
        base = API_CODES.get(code)
        if base is None:
            return ApiError
        cls = type(f"{base.__name__}Error", (ApiError, base), {"__doc__": base.__doc__})
        cls.__module__ = __name__
        _API_CLASSES[code] = cls
    return cls


def api_error(code: str, message: str, status: int) -> ApiError:
    """What the client raises for an error answer ``{"error": code, "message": ...}``."""
    return api_error_class(code)(code, message, status)
