"""Ray's ``ray.experimental``: of it, lightwork has only the state API's old home,
``ray.experimental.state.api`` (now ``ray.util.state``, which is :mod:`lightwork.state`).
Any other ``ray.experimental`` module fails at import with a message saying so."""
