/* lightwork._collector: take an object out of CPython's cyclic garbage collector, or put
 * it back (issue 13). Two functions of the C API that Python does not expose; what may
 * be untracked, and why, is in lightwork/_runtime/collector.py, which also holds the
 * pure-Python fallback used when this module is not built. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
collector_untrack(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

static PyObject *
collector_track(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

static PyMethodDef collector_methods[] = {
    {"untrack", collector_untrack, METH_O,
     "untrack(obj): the collector no longer visits obj (no-op if it does not)."},
    {"track", collector_track, METH_O,
     "track(obj): the collector visits obj again (no-op if it does)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef collector_module = {
    PyModuleDef_HEAD_INIT, "lightwork._collector",
    "Untrack and track objects in CPython's cyclic garbage collector.", -1,
    collector_methods,
};

PyMODINIT_FUNC
PyInit__collector(void)
{
    return PyModule_Create(&collector_module);
}
