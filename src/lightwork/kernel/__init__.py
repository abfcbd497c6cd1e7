"""The kernel: what both engines and the API share, importing nothing above it.

Ids and :class:`ObjectRef` (``object_ref``), the error types (``exceptions``), pickling
(``pickler``, ``serialization``), call specs and option checks (``calls``), resource
shapes (``resources``), runtime environments (``runtime_env``), the event log
(``events``, ``collector``), the control server (``control``), session directories
(``session``), and the :class:`~lightwork.kernel.backend.Backend` interface every engine
implements (``backend``). Layers above plug in by registration (``control.register_ops``,
``backend.set_resolver``), never by being imported from here.
"""
