"""Ray's old path of the state API: see :mod:`lightwork.experimental.state.api`."""
