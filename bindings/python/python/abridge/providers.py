"""The engine's own provider clients, for a :class:`abridge.Runner`'s
``model`` (or, with ``summary_model``, its ``summariser``).

Each reads its usual environment variables when an argument is not given,
as the provider's own SDKs do:

- :class:`OpenAIChat` and :class:`OpenAIResponses`: ``OPENAI_API_KEY``
  (optional, for a local server that wants none) and ``OPENAI_BASE_URL``
  (the URL the paths are added to, ``/v1`` included);
- :class:`Anthropic`: ``ANTHROPIC_API_KEY`` (required) and
  ``ANTHROPIC_BASE_URL`` (the API's root; ``/v1/messages`` is added).

The HTTP work (retries, timeouts, the size cap on answers, the typed errors
of a hostile answer) is the engine's; no request passes through Python.
"""

from ._abridge import Anthropic, OpenAIChat, OpenAIResponses, Provider

__all__ = ["Anthropic", "OpenAIChat", "OpenAIResponses", "Provider"]
