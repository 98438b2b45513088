/* One launcher for every compiled Triton kernel (runtime/cuda_launcher.py).

Triton builds a C launcher per kernel signature (the argument types), with the C compiler, the
first time a kernel of that signature loads on a machine: a BERT training step's kernels have
22 signatures, 0.2-0.3 s of compiler each, beside the kernels' own compiles on a first call.
This one reads the argument types from a string per kernel instead, so it is built once.

It is called as Triton's own launcher's `launch` is (so the wrapper's calls are the same):

    launch(grid_x, grid_y, grid_z, stream, function, cooperative, dependent, global_scratch,
           profile_scratch, (num_warps, num_ctas, shared_memory, types), launch_metadata,
           enter_hook, exit_hook, *arguments)

`types` has one character per argument: p a device pointer (an int, None, or an object with
data_ptr()), b/h/i/l a signed int of 8/16/32/64 bits, B/H/I/L unsigned, e fp16, g bf16,
f fp32, d fp64 (packed as Triton packs them), x a compile-time constant (not passed). The
kernel's scratch buffers must be absent and num_ctas 1 (the Python side sends other kernels to
Triton's launcher). CUDA's driver is opened when the first kernel launches.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

#define FIXED_ARGUMENTS 13
#define MOST_ARGUMENTS 512

typedef CUresult (*launch_kernel_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*error_string_t)(CUresult, const char **);
typedef CUresult (*current_context_t)(CUcontext *);
typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*retain_context_t)(CUcontext *, CUdevice);
typedef CUresult (*set_context_t)(CUcontext);

static launch_kernel_t launch_kernel = NULL;
static error_string_t error_string = NULL;
static current_context_t current_context = NULL;
static device_get_t device_get = NULL;
static retain_context_t retain_context = NULL;
static set_context_t set_context = NULL;
static PyObject *data_ptr_name = NULL;

static int open_driver(void) {
  if (launch_kernel != NULL) return 0;
  void *cuda = dlopen("libcuda.so.1", RTLD_LAZY);
  if (cuda == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ember's Triton launcher: cannot open libcuda.so.1");
    return -1;
  }
  error_string = (error_string_t)dlsym(cuda, "cuGetErrorString");
  current_context = (current_context_t)dlsym(cuda, "cuCtxGetCurrent");
  device_get = (device_get_t)dlsym(cuda, "cuDeviceGet");
  retain_context = (retain_context_t)dlsym(cuda, "cuDevicePrimaryCtxRetain");
  set_context = (set_context_t)dlsym(cuda, "cuCtxSetCurrent");
  launch_kernel_t found = (launch_kernel_t)dlsym(cuda, "cuLaunchKernelEx");
  if (!found || !error_string || !current_context || !device_get || !retain_context ||
      !set_context) {
    PyErr_SetString(PyExc_RuntimeError,
                    "ember's Triton launcher: libcuda.so.1 lacks cuLaunchKernelEx");
    return -1;
  }
  launch_kernel = found;
  return 0;
}

static int cuda_failed(CUresult code) {
  if (code == CUDA_SUCCESS) return 0;
  const char *text = "unknown error";
  if (error_string != NULL) error_string(code, &text);
  PyErr_Format(PyExc_RuntimeError, "Triton Error [CUDA]: %s", text);
  return 1;
}

/* As Triton's launcher: a thread with no current context (one torch never ran CUDA work on)
   gets device 0's primary context. */
static int ensure_context(void) {
  if (current_context == NULL) return 0; /* (a test's launch function: no driver) */
  CUcontext context = NULL;
  if (cuda_failed(current_context(&context))) return -1;
  if (context != NULL) return 0;
  CUdevice device;
  if (cuda_failed(device_get(&device, 0)) || cuda_failed(retain_context(&context, device)) ||
      cuda_failed(set_context(context)))
    return -1;
  return 0;
}

static int pointer_of(PyObject *value, uint64_t *slot, Py_ssize_t position) {
  if (value == Py_None) {
    *slot = 0;
    return 0;
  }
  if (PyLong_Check(value)) {
    *slot = PyLong_AsUnsignedLongLong(value);
    return PyErr_Occurred() ? -1 : 0;
  }
  PyObject *pointer = PyObject_CallMethodNoArgs(value, data_ptr_name);
  if (pointer == NULL) return -1;
  if (!PyLong_Check(pointer)) {
    Py_DECREF(pointer);
    PyErr_Format(PyExc_TypeError, "argument %zd: data_ptr() must return an int", position);
    return -1;
  }
  *slot = PyLong_AsUnsignedLongLong(pointer);
  Py_DECREF(pointer);
  return PyErr_Occurred() ? -1 : 0;
}

static uint16_t bf16_of(double value) { /* (Triton's packing: the float's top half) */
  float single = (float)value;
  uint32_t bits;
  memcpy(&bits, &single, 4);
  return (uint16_t)(bits >> 16);
}

/* The argument in `slot` as the kernel reads it (little-endian: its first bytes). */
static int pack(char type, PyObject *value, uint64_t *slot, Py_ssize_t position) {
  *slot = 0;
  if (type == 'p') return pointer_of(value, slot, position);
  if (type == 'e' || type == 'g' || type == 'f' || type == 'd') {
    double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) return -1;
    if (type == 'd') {
      memcpy(slot, &number, 8);
    } else if (type == 'f') {
      float single = (float)number;
      memcpy(slot, &single, 4);
    } else if (type == 'g') {
      uint16_t half = bf16_of(number);
      memcpy(slot, &half, 2);
    } else {
      unsigned char half[2];
      if (PyFloat_Pack2(number, (char *)half, 1) < 0) return -1;
      memcpy(slot, half, 2);
    }
    return 0;
  }
  if (type == 'B' || type == 'H' || type == 'I' || type == 'L') {
    unsigned long long number = PyLong_AsUnsignedLongLong(value);
    if (number == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    unsigned long long most = type == 'B' ? UINT8_MAX : type == 'H' ? UINT16_MAX
                              : type == 'I' ? UINT32_MAX : UINT64_MAX;
    if (number > most) {
      PyErr_Format(PyExc_OverflowError, "argument %zd: %llu does not fit its type '%c'",
                   position, number, type);
      return -1;
    }
    *slot = number; /* (little-endian: its first bytes are the narrower value) */
    return 0;
  }
  long long number = PyLong_AsLongLong(value);
  if (number == -1 && PyErr_Occurred()) return -1;
  long long most = type == 'b' ? INT8_MAX : type == 'h' ? INT16_MAX : type == 'i' ? INT32_MAX
                                                                                  : INT64_MAX;
  if (number > most || number < -most - 1) { /* (as Triton's launcher refuses it) */
    PyErr_Format(PyExc_OverflowError, "argument %zd: %lld does not fit its type '%c'",
                 position, number, type);
    return -1;
  }
  switch (type) {
    case 'b': { int8_t n = (int8_t)number; memcpy(slot, &n, 1); return 0; }
    case 'h': { int16_t n = (int16_t)number; memcpy(slot, &n, 2); return 0; }
    case 'i': { int32_t n = (int32_t)number; memcpy(slot, &n, 4); return 0; }
    case 'l': { int64_t n = (int64_t)number; memcpy(slot, &n, 8); return 0; }
  }
  PyErr_Format(PyExc_ValueError, "argument %zd: unknown type code '%c'", position, type);
  return -1;
}

static int call_hook(PyObject *hook, PyObject *metadata) {
  if (hook == Py_None) return 0;
  PyObject *result = PyObject_CallOneArg(hook, metadata);
  if (result == NULL) return -1;
  Py_DECREF(result);
  return 0;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t count) {
  if (count < FIXED_ARGUMENTS) {
    PyErr_SetString(PyExc_TypeError, "launch: too few arguments");
    return NULL;
  }
  int grid[3];
  for (int axis = 0; axis < 3; axis++) {
    grid[axis] = (int)PyLong_AsLong(args[axis]);
    if (grid[axis] == -1 && PyErr_Occurred()) return NULL;
  }
  uint64_t stream = PyLong_AsUnsignedLongLong(args[3]);
  uint64_t function = PyLong_AsUnsignedLongLong(args[4]);
  if (PyErr_Occurred()) return NULL;
  int cooperative = PyObject_IsTrue(args[5]), dependent = PyObject_IsTrue(args[6]);
  if (cooperative < 0 || dependent < 0) return NULL;
  if (args[7] != Py_None || args[8] != Py_None) {
    PyErr_SetString(PyExc_ValueError, "launch: kernels with scratch buffers take Triton's launcher");
    return NULL;
  }
  PyObject *metadata = args[9];
  if (!PyTuple_Check(metadata) || PyTuple_GET_SIZE(metadata) != 4) {
    PyErr_SetString(PyExc_TypeError, "launch: (num_warps, num_ctas, shared_memory, types)");
    return NULL;
  }
  int warps = (int)PyLong_AsLong(PyTuple_GET_ITEM(metadata, 0));
  int ctas = (int)PyLong_AsLong(PyTuple_GET_ITEM(metadata, 1));
  int shared = (int)PyLong_AsLong(PyTuple_GET_ITEM(metadata, 2));
  if (PyErr_Occurred()) return NULL;
  Py_ssize_t length;
  const char *codes = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(metadata, 3), &length);
  if (codes == NULL) return NULL;
  Py_ssize_t given = count - FIXED_ARGUMENTS;
  if (given != length || length > MOST_ARGUMENTS) {
    PyErr_Format(PyExc_TypeError, "launch: %zd arguments for %zd types (at most %d)", given,
                 length, MOST_ARGUMENTS);
    return NULL;
  }
  if (ctas != 1) {
    PyErr_SetString(PyExc_ValueError, "launch: kernels of several CTAs take Triton's launcher");
    return NULL;
  }
  if (call_hook(args[11], args[10]) < 0) return NULL;
  if (open_driver() < 0 || ensure_context() < 0) return NULL;

  uint64_t slots[MOST_ARGUMENTS + 2];
  void *params[MOST_ARGUMENTS + 2];
  int used = 0;
  for (Py_ssize_t k = 0; k < length; k++) {
    if (codes[k] == 'x') continue;
    if (pack(codes[k], args[FIXED_ARGUMENTS + k], &slots[used], k) < 0) return NULL;
    params[used] = &slots[used];
    used++;
  }
  slots[used] = 0; /* global scratch */
  params[used] = &slots[used];
  used++;
  slots[used] = 0; /* profile scratch */
  params[used] = &slots[used];

  if ((long long)grid[0] * grid[1] * grid[2] > 0) {
    CUlaunchAttribute attributes[2];
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    memset(attributes, 0, sizeof attributes);
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = 32 * warps;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = shared;
    config.hStream = (CUstream)stream;
    config.attrs = attributes;
    if (dependent) {
      attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attributes[config.numAttrs].value.programmaticStreamSerializationAllowed = 1;
      config.numAttrs++;
    }
    if (cooperative) {
      attributes[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attributes[config.numAttrs].value.cooperative = 1;
      config.numAttrs++;
    }
    CUresult result;
    Py_BEGIN_ALLOW_THREADS;
    result = launch_kernel(&config, (CUfunction)function, params, NULL);
    Py_END_ALLOW_THREADS;
    if (cuda_failed(result)) return NULL;
  }
  if (call_hook(args[12], args[10]) < 0) return NULL;
  Py_RETURN_NONE;
}

/* Tests: launch through `address` (a function with cuLaunchKernelEx's signature) instead of
   CUDA's driver, which is then never opened. */
static PyObject *use_launch_function(PyObject *self, PyObject *address) {
  void *pointer = PyLong_AsVoidPtr(address);
  if (pointer == NULL && PyErr_Occurred()) return NULL;
  launch_kernel = (launch_kernel_t)pointer;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "Launch a compiled Triton kernel (the arguments as Triton's launchers take them)."},
    {"use_launch_function", use_launch_function, METH_O,
     "Tests: launch through a function at this address instead of CUDA's driver."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ember_cuda_launcher", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_ember_cuda_launcher(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (data_ptr_name == NULL) return NULL;
  return PyModule_Create(&module);
}
