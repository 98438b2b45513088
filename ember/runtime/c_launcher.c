/* Ember's caller of generated C kernels (ember/runtime/c_launcher.py).
 *
 * A kernel is `int kernel(T0* a0, ..., int64_t s0, ...)`: data pointers, then sizes. Called
 * through ctypes, each call cost ~0.4 us more than through this (its argument conversions,
 * its libffi call); a decoding step of a small GPT-2 launches ~60 kernels. A Kernel object holds
 * the kernel's address and argument count and is called by vectorcall: each argument a
 * Python int (a data_ptr() or a size), converted to 64 bits, and the kernel called through a
 * pointer of as many int64_t arguments. On the System V x86-64 and AAPCS64 ABIs a pointer
 * and an int64_t are passed alike (integer registers, then 8-byte stack slots), so the
 * call is the one the kernel's own signature makes.
 *
 * The GIL: released around kernels that may run long (those with a parallel region: each
 * Kernel says), held around the others. Released for a few microseconds, it lets another
 * Python thread (a compile, a warm keep) take it, and the caller then waits for it up to
 * the interpreter's switch interval.
 *
 * The switch's cases, one per arity, are written in by c_launcher.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define EMBER_MAX_ARGUMENTS 64

typedef int64_t i64;
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void *address;
    Py_ssize_t arity;
    int release;
    PyObject *dict;  /* (attributes: the ctypes function kept beside it, its name) */
} Kernel;

static int call_kernel(void *address, Py_ssize_t arity, const i64 *a) {
    switch (arity) {
/* CASES */
        default: return -1;
    }
}

static int as_i64(PyObject *value, i64 *out) {
    if (PyLong_CheckExact(value) || PyLong_Check(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow == 0) {
            if (v == -1 && PyErr_Occurred())
                return -1;
            *out = (i64)v;
            return 0;
        }
        unsigned long long u = PyLong_AsUnsignedLongLong(value); /* (an address past 2^63) */
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        *out = (i64)u;
        return 0;
    }
    if (value == Py_None) { /* (ctypes' c_void_p takes None for NULL) */
        *out = 0;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "a kernel argument of type %s (an int was expected)",
                 Py_TYPE(value)->tp_name);
    return -1;
}

static PyObject *kernel_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Kernel *self = (Kernel *)self_;
    Py_ssize_t count = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "a kernel takes no keyword arguments");
        return NULL;
    }
    if (count != self->arity) {
        PyErr_Format(PyExc_TypeError, "the kernel takes %zd arguments (%zd given)",
                     self->arity, count);
        return NULL;
    }
    i64 a[EMBER_MAX_ARGUMENTS];
    for (Py_ssize_t i = 0; i < count; i++)
        if (as_i64(args[i], &a[i]) < 0)
            return NULL;
    int status;
    if (self->release) {
        Py_BEGIN_ALLOW_THREADS
        status = call_kernel(self->address, count, a);
        Py_END_ALLOW_THREADS
    } else {
        status = call_kernel(self->address, count, a);
    }
    return PyLong_FromLong(status);
}

static PyObject *kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long address;
    Py_ssize_t arity;
    int release = 0;
    static char *names[] = {"address", "arity", "release", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Kn|p", names, &address, &arity,
                                     &release))
        return NULL;
    if (address == 0 || arity < 0 || arity > EMBER_MAX_ARGUMENTS) {
        PyErr_Format(PyExc_ValueError, "no kernel at %llu with %zd arguments (at most %d)",
                     address, arity, EMBER_MAX_ARGUMENTS);
        return NULL;
    }
    Kernel *self = (Kernel *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = kernel_vectorcall;
    self->address = (void *)(uintptr_t)address;
    self->arity = arity;
    self->release = release;
    self->dict = NULL;
    return (PyObject *)self;
}

static int kernel_traverse(Kernel *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    return 0;
}

static int kernel_clear(Kernel *self) {
    Py_CLEAR(self->dict);
    return 0;
}

static void kernel_dealloc(Kernel *self) {
    PyObject_GC_UnTrack(self);
    kernel_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *kernel_arity(Kernel *self, void *closure) {
    return PyLong_FromSsize_t(self->arity);
}

static PyObject *kernel_releases(Kernel *self, void *closure) {
    return PyBool_FromLong(self->release);
}

static PyGetSetDef kernel_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"arity", (getter)kernel_arity, NULL, "the kernel's argument count", NULL},
    {"releases_gil", (getter)kernel_releases, NULL, "is the GIL released around calls", NULL},
    {NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ember_c_launcher.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A generated C kernel, called with its arguments as ints.",
    .tp_new = kernel_new,
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_traverse = (traverseproc)kernel_traverse,
    .tp_clear = (inquiry)kernel_clear,
    .tp_vectorcall_offset = offsetof(Kernel, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(Kernel, dict),
    .tp_getset = kernel_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ember_c_launcher", "Ember's caller of generated C kernels.", -1,
    NULL,
};

PyMODINIT_FUNC PyInit_ember_c_launcher(void) {
    if (PyType_Ready(&KernelType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(m, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(&KernelType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_ARGUMENTS", EMBER_MAX_ARGUMENTS);
    return m;
}
