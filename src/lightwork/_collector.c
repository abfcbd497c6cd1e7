/* lightwork._collector: take an object out of CPython's cyclic garbage collector, or put
 * it back; and make the hot path's instances of slotted classes with their defaults,
 * out of the collector from birth (issue 13). What Python cannot do itself: what may be
 * untracked, and why, is in lightwork/_runtime/collector.py, which also holds the
 * pure-Python fallback used when this module is not built.
 *
 * A Maker stands for a class built with __slots__ (a dataclass(slots=True)): called
 * with the values of its first fields, in the order of the class's fields, it makes an
 * instance with those values and the class's defaults for the rest, without running
 * __init__. A task's record has 29 fields, its spec 20 and its result's table entry 16;
 * their generated __init__ stores each one (three bytecodes a field: 0.15-0.22 us an
 * instance, where a Maker takes ~0.05). The offsets of the slots are read once, from
 * the class's member descriptors; the defaults must be values that may be shared
 * (collector.py checks: no default factories). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

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

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *defaults;   /* a tuple: one value per field; the required fields' are None */
    Py_ssize_t fields;    /* how many fields (slots) an instance gets */
    Py_ssize_t required;  /* the first this many must be passed */
    int untracked;        /* make instances out of the collector */
    Py_ssize_t *offsets;  /* each field's slot, from the instance's start */
} MakerObject;

static PyObject *
maker_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    MakerObject *maker = (MakerObject *)callable;
    Py_ssize_t given = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError, "a maker of %s takes its fields by position only",
                     maker->cls->tp_name);
        return NULL;
    }
    if (given < maker->required || given > maker->fields) {
        PyErr_Format(PyExc_TypeError, "a maker of %s takes %zd to %zd fields (%zd given)",
                     maker->cls->tp_name, maker->required, maker->fields, given);
        return NULL;
    }
    PyObject *obj = maker->cls->tp_alloc(maker->cls, 0);
    if (obj == NULL) {
        return NULL;
    }
    char *base = (char *)obj;
    Py_ssize_t i = 0;
    for (; i < given; i++) {
        *(PyObject **)(base + maker->offsets[i]) = Py_NewRef(args[i]);
    }
    for (; i < maker->fields; i++) {
        *(PyObject **)(base + maker->offsets[i]) =
            Py_NewRef(PyTuple_GET_ITEM(maker->defaults, i));
    }
    if (maker->untracked && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    return obj;
}

static PyObject *
maker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"cls", "names", "defaults", "required", "untracked", NULL};
    PyTypeObject *cls;
    PyObject *names, *defaults;
    Py_ssize_t required;
    int untracked;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!np:Maker", keywords, &PyType_Type,
                                     &cls, &PyTuple_Type, &names, &PyTuple_Type, &defaults,
                                     &required, &untracked)) {
        return NULL;
    }
    Py_ssize_t fields = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(defaults) != fields || required < 0 || required > fields) {
        PyErr_SetString(PyExc_ValueError,
                        "Maker: one default per name, and 0 <= required <= len(names)");
        return NULL;
    }
    Py_ssize_t *offsets = PyMem_Calloc(fields ? fields : 1, sizeof(Py_ssize_t));
    if (offsets == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < fields; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *descr = PyUnicode_Check(name)
            ? PyDict_GetItemWithError(cls->tp_dict, name) : NULL;  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
                || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "Maker: %R is not a slot of %s itself",
                             name, cls->tp_name);
            }
            PyMem_Free(offsets);
            return NULL;
        }
        offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    MakerObject *maker = (MakerObject *)type->tp_alloc(type, 0);
    if (maker == NULL) {
        PyMem_Free(offsets);
        return NULL;
    }
    maker->vectorcall = maker_call;
    maker->cls = (PyTypeObject *)Py_NewRef(cls);
    maker->defaults = Py_NewRef(defaults);
    maker->fields = fields;
    maker->required = required;
    maker->untracked = untracked;
    maker->offsets = offsets;
    return (PyObject *)maker;
}

static void
maker_dealloc(MakerObject *maker)
{
    Py_XDECREF(maker->cls);
    Py_XDECREF(maker->defaults);
    PyMem_Free(maker->offsets);
    Py_TYPE(maker)->tp_free((PyObject *)maker);
}

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lightwork._collector.Maker",
    .tp_doc = "Maker(cls, names, defaults, required, untracked): makes instances of a "
              "slotted class from its first fields' values and the defaults of the rest.",
    .tp_basicsize = sizeof(MakerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = maker_new,
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(MakerObject, vectorcall),
};

static PyMethodDef collector_methods[] = {
    {"untrack", collector_untrack, METH_O,
     "untrack(obj): the collector no longer visits obj (no-op if it does not)."},
    {"track", collector_track, METH_O,
     "track(obj): the collector visits obj again (no-op if it does)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef collector_module = {
    PyModuleDef_HEAD_INIT, "lightwork._collector",
    "Untrack and track objects in CPython's cyclic garbage collector; make slotted "
    "instances out of it.", -1,
    collector_methods,
};

PyMODINIT_FUNC
PyInit__collector(void)
{
    if (PyType_Ready(&MakerType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&collector_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Maker", (PyObject *)&MakerType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
