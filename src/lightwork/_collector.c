/* lightwork._collector: take an object out of CPython's cyclic garbage collector, or put
 * it back; make the hot path's instances of slotted classes with their defaults, out of
 * the collector from birth; and read the run times of ended tasks' records for the
 * advisor's tally. What Python cannot do itself, or not fast enough: what may
 * be untracked, and why, is in lightwork/kernel/collector.py, which also holds the
 * pure-Python fallbacks used when this module is not built (the tally's is in
 * lightwork/diagnostics/_measure.py).
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

/* Where, from an instance's start, the slot ``names[i]`` of ``cls`` (its own, holding an
 * object) lives, for each i, into offsets; -1 with TypeError naming ``who`` if one is not. */
static int
slot_offsets(const char *who, PyTypeObject *cls, PyObject *names, Py_ssize_t *offsets)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *descr = PyUnicode_Check(name)
            ? PyDict_GetItemWithError(cls->tp_dict, name) : NULL;  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
                || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%s: %R is not a slot of %s itself", who,
                             name, cls->tp_name);
            }
            return -1;
        }
        offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return 0;
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
    if (slot_offsets("Maker", cls, names, offsets) < 0) {
        PyMem_Free(offsets);
        return NULL;
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

/* A RunSummer reads a TaskRecord's run times straight from its slots, as a Maker writes
 * them: the advisor's tally (lightwork/diagnostics/_measure.py, RunTally.ended) sums the
 * runs of every task that ends, and its Python loop cannot go under ~53 ns a record
 * (its five attribute reads and tests), ~1% of a 5 us task; here ~5 ns. Called with a
 * list of records, where to start, the bucket [low, high) and long_s, and the list of
 * notable places to append to, it sums the runs of one slot inside the bucket and
 * returns (the sum, where it stopped): at the end, or at the first record it cannot
 * sum (another bucket, more than one slot, never run, or a field that is not a float),
 * which the caller handles in Python before calling again from the next. A record is
 * notable (its place appended) when its run from its arguments loaded reaches long_s or
 * it has big arguments (a non-empty large_args). */
enum { RUN_STARTED, RUN_FINISHED, RUN_NUM_CPUS, RUN_ARGS_LOADED, RUN_LARGE_ARGS, RUN_FIELDS };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t offsets[RUN_FIELDS];
} RunSummerObject;

static int
read_float(PyObject *record, Py_ssize_t offset, double *out)
{
    PyObject *value = *(PyObject **)((char *)record + offset);
    if (value == NULL || !PyFloat_CheckExact(value)) {
        return 0;
    }
    *out = PyFloat_AS_DOUBLE(value);
    return 1;
}

static PyObject *
summer_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    RunSummerObject *summer = (RunSummerObject *)callable;
    Py_ssize_t given = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || given != 6
            || !PyList_CheckExact(args[0]) || !PyLong_Check(args[1])
            || !PyFloat_CheckExact(args[2]) || !PyFloat_CheckExact(args[3])
            || !PyFloat_Check(args[4]) || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "RunSummer(records: list, start: int, low: float, "
                        "high: float, long_s: float, notable: list), by position");
        return NULL;
    }
    PyObject *records = args[0], *notable = args[5];
    Py_ssize_t place = PyLong_AsSsize_t(args[1]);
    if (place == -1 && PyErr_Occurred()) {
        return NULL;
    }
    double low = PyFloat_AS_DOUBLE(args[2]), high = PyFloat_AS_DOUBLE(args[3]);
    double long_s = PyFloat_AsDouble(args[4]);
    double summed = 0.0;
    Py_ssize_t *offsets = summer->offsets;
    for (; place < PyList_GET_SIZE(records); place++) {
        PyObject *record = PyList_GET_ITEM(records, place);
        double start, end, cpus, loaded;
        PyObject *large;
        if (!Py_IS_TYPE(record, summer->cls)
                || !read_float(record, offsets[RUN_STARTED], &start)
                || !read_float(record, offsets[RUN_FINISHED], &end)
                || !read_float(record, offsets[RUN_NUM_CPUS], &cpus)
                || !read_float(record, offsets[RUN_ARGS_LOADED], &loaded)
                || (large = *(PyObject **)((char *)record + offsets[RUN_LARGE_ARGS])) == NULL
                || !PyTuple_CheckExact(large)
                || !(low <= start && end < high && start < end && cpus == 1.0)) {
            break;  /* the caller's Python handles it */
        }
        summed += end - start;
        if (end - loaded >= long_s || PyTuple_GET_SIZE(large) != 0) {
            PyObject *number = PyLong_FromSsize_t(place);
            if (number == NULL || PyList_Append(notable, number) < 0) {
                Py_XDECREF(number);
                return NULL;
            }
            Py_DECREF(number);
        }
    }
    return Py_BuildValue("(dn)", summed, place);
}

static PyObject *
summer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"cls", "names", NULL};
    PyTypeObject *cls;
    PyObject *names;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!:RunSummer", keywords, &PyType_Type,
                                     &cls, &PyTuple_Type, &names)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(names) != RUN_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "RunSummer: the names of started, finished, "
                        "num_cpus, args_loaded and large_args, in that order");
        return NULL;
    }
    RunSummerObject *summer = (RunSummerObject *)type->tp_alloc(type, 0);
    if (summer == NULL) {
        return NULL;
    }
    if (slot_offsets("RunSummer", cls, names, summer->offsets) < 0) {
        Py_DECREF(summer);
        return NULL;
    }
    summer->vectorcall = summer_call;
    summer->cls = (PyTypeObject *)Py_NewRef(cls);
    return (PyObject *)summer;
}

static void
summer_dealloc(RunSummerObject *summer)
{
    Py_XDECREF(summer->cls);
    Py_TYPE(summer)->tp_free((PyObject *)summer);
}

static PyTypeObject RunSummerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lightwork._collector.RunSummer",
    .tp_doc = "RunSummer(cls, names): sums task records' runs inside a bucket (the "
              "advisor's tally).",
    .tp_basicsize = sizeof(RunSummerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = summer_new,
    .tp_dealloc = (destructor)summer_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RunSummerObject, vectorcall),
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
    if (PyType_Ready(&MakerType) < 0 || PyType_Ready(&RunSummerType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&collector_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Maker", (PyObject *)&MakerType) < 0
            || PyModule_AddObjectRef(module, "RunSummer", (PyObject *)&RunSummerType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
