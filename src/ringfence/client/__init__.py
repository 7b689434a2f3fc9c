"""The Python SDK: ``AsyncRingfence`` (source of truth) and its blocking twin ``Ringfence``.

Importing it loads neither the server, the store nor any backend.
"""

from ringfence.client._async import AsyncRingfence
from ringfence.client._sync import Ringfence

__all__ = ["AsyncRingfence", "Ringfence"]
