/* Tensor allocation for the C replay of recorded CUDA launches, through torch's C++ API.
 *
 * The C replay (_claunch.h) allocates a call's outputs with torch.empty_strided /
 * torch.zeros, called from C as Python functions: their argument parsing is most of
 * a repeated call's host time. This extension allocates the same tensors through
 * at::empty_strided / at::zeros (the same dispatcher, caching allocator and device
 * guard as those functions, without the Python layer) and wraps them as torch.Tensor
 * objects. It is compiled against the installed torch's headers by the system C++
 * compiler, once per torch version, in the background after the first recorded CUDA
 * call (rl_triton_core/scan/_torchalloc.py); where it is not built, the replay calls
 * the Python functions as before.
 *
 * The module exports the capsule "alloc": a C function
 *     PyObject *alloc(int ndim, const int64_t *size, const int64_t *stride,
 *                     int scalar_type, int device_type, int device_index, int zeroed)
 * (a new reference, or NULL with a Python error set); the capsule "plain" where this
 * torch's tensor object has the layout checked below: int plain(PyObject *tensor), the
 * replay's check that a tensor needs no autograd and has no negative bit; and
 * scalar_type(dtype): the c10::ScalarType number of a torch.dtype, which the caller
 * checks its own table against before it uses the capsules.
 */
#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Export.h>

#include <exception>

/* torch/csrc/autograd/python_variable.h declares it (that header pulls in pybind11) */
TORCH_PYTHON_API PyObject *THPVariable_Wrap(const at::TensorBase &var);

/* The head of torch's THPVariable (python_variable.h) since torch 2.10: the Python
 * object, then the tensor. Checked when the module loads (a tensor wrapped here is
 * read back through it); "plain" is exported only where the check holds. */
struct THPVariableHead {
    PyObject_HEAD at::Tensor cdata;
};

/* 1 where the torch.Tensor o needs no autograd and has no negative bit (the C replay
 * takes it as it is), else 0: what reading o.requires_grad and o.is_neg() from Python
 * says, without the attribute lookups */
static int plain(PyObject *o) {
    const at::Tensor &t = reinterpret_cast<THPVariableHead *>(o)->cdata;
    return !t.requires_grad() && !t.is_neg();
}

static bool head_matches() {
    try {
        at::Tensor t = at::empty({1});
        PyObject *o = THPVariable_Wrap(t);
        if (!o) return false;
        const bool ok = reinterpret_cast<THPVariableHead *>(o)->cdata.unsafeGetTensorImpl() ==
                        t.unsafeGetTensorImpl();
        Py_DECREF(o);
        return ok;
    } catch (const std::exception &) {
        return false;
    }
}

static PyObject *alloc(int ndim, const int64_t *size, const int64_t *stride, int scalar_type,
                       int device_type, int device_index, int zeroed) {
    try {
        const auto opt = at::TensorOptions()
                             .dtype(static_cast<c10::ScalarType>(scalar_type))
                             .device(c10::Device(static_cast<c10::DeviceType>(device_type),
                                                 static_cast<c10::DeviceIndex>(device_index)));
        const c10::IntArrayRef sizes(size, static_cast<size_t>(ndim));
        at::Tensor t = zeroed ? at::zeros(sizes, opt)
                              : at::empty_strided(sizes, c10::IntArrayRef(stride, ndim), opt);
        return THPVariable_Wrap(t);
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
}

static PyObject *scalar_type(PyObject *, PyObject *arg) {
    if (!THPDtype_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "scalar_type(dtype): a torch.dtype");
        return nullptr;
    }
    return PyLong_FromLong(static_cast<long>(reinterpret_cast<THPDtype *>(arg)->scalar_type));
}

static PyMethodDef methods[] = {
    {"scalar_type", scalar_type, METH_O, "scalar_type(dtype): its c10::ScalarType number."},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torchalloc_ext",
                                    "Tensor allocation through torch's C++ API.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__torchalloc_ext(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return nullptr;
    PyObject *cap = PyCapsule_New(reinterpret_cast<void *>(&alloc),
                                  "rl_triton_core._torchalloc.alloc", nullptr);
    if (!cap || PyModule_AddObject(m, "alloc", cap)) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return nullptr;
    }
    if (head_matches()) {
        cap = PyCapsule_New(reinterpret_cast<void *>(&plain), "rl_triton_core._torchalloc.plain",
                            nullptr);
        if (!cap || PyModule_AddObject(m, "plain", cap)) {
            Py_XDECREF(cap);
            Py_DECREF(m);
            return nullptr;
        }
    }
    return m;
}
