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
 * The module exports the capsule "alloc" (named rl_triton_core._torchalloc.alloc2): a C
 * function
 *     PyObject *alloc(int ndim, const int64_t *size, const int64_t *stride,
 *                     int scalar_type, int device_type, int device_index, int zeroed,
 *                     void **data)
 * (a new reference and in *data its address, or NULL with a Python error set); the
 * capsule "scratch" (get and put of a call's CUDA scratch block); the capsule "plain"
 * where this
 * torch's tensor object has the layout checked below: int plain(PyObject *tensor), the
 * replay's check that a tensor needs no autograd and has no negative bit; and
 * scalar_type(dtype): the c10::ScalarType number of a torch.dtype, which the caller
 * checks its own table against before it uses the capsules.
 */
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/TensorBase.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Export.h>

#include <exception>
#include <stdexcept>

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

/* DLPack's DLTensor, as _cscan.c declares it (dl_tensor_t) */
struct DLView {
    void *data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    const int64_t *shape, *strides;
    uint64_t byte_offset;
};

/* A CPU or CUDA tensor's description, as torch's DLPack exchange table gives it
 * (dltensor_from_py_object_no_sync) for the dtypes below, read from the tensor itself:
 * 0 where it is plain (see plain()), 1 where it is not (described all the same), 2
 * where this does not describe it (another device, layout or dtype, a tensor subclass
 * in C++, symbolic sizes): the exchange table then. The caller checks o's type. */
static int view(PyObject *o, DLView *d) try {
    const at::Tensor &t = reinterpret_cast<THPVariableHead *>(o)->cdata;
    c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    /* a plain tensor's keys: no wrapper (functionalization, functorch's transforms,
     * a Python subclass in C++), whose sizes or memory are not the tensor's own */
    static const c10::DispatchKeySet cpu_keys(
        {c10::DispatchKey::CPU, c10::DispatchKey::AutogradCPU, c10::DispatchKey::ADInplaceOrView,
         c10::DispatchKey::AutocastCPU, c10::DispatchKey::Negative, c10::DispatchKey::Conjugate});
    static const c10::DispatchKeySet cuda_keys(
        {c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCUDA, c10::DispatchKey::ADInplaceOrView,
         c10::DispatchKey::AutocastCUDA, c10::DispatchKey::Negative, c10::DispatchKey::Conjugate});
    if (!impl) return 2;
    const c10::DeviceType dev = impl->device_type();
    const bool cuda = dev == c10::DeviceType::CUDA;
    if (!(dev == c10::DeviceType::CPU || cuda) ||
        !(cuda ? cuda_keys : cpu_keys).isSupersetOf(impl->key_set()) ||
        impl->layout() != c10::kStrided || impl->has_symbolic_sizes_strides() ||
        impl->is_nested() || !impl->has_storage())
        return 2;
    uint8_t code, bits;
    switch (c10::typeMetaToScalarType(impl->dtype())) {
    case c10::ScalarType::Float: code = 2, bits = 32; break;
    case c10::ScalarType::Double: code = 2, bits = 64; break;
    case c10::ScalarType::Half: code = 2, bits = 16; break;
    case c10::ScalarType::BFloat16: code = 4, bits = 16; break;
    case c10::ScalarType::Bool: code = 6, bits = 8; break;
    case c10::ScalarType::Byte: code = 1, bits = 8; break;
    case c10::ScalarType::Char: code = 0, bits = 8; break;
    case c10::ScalarType::Short: code = 0, bits = 16; break;
    case c10::ScalarType::Int: code = 0, bits = 32; break;
    case c10::ScalarType::Long: code = 0, bits = 64; break;
    default: return 2;
    }
    const c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
    d->data = const_cast<void *>(impl->data());
    d->device_type = cuda ? 2 : 1; /* kDLCUDA, kDLCPU */
    d->device_id = cuda ? impl->device().index() : 0;
    d->ndim = static_cast<int32_t>(sizes.size());
    d->code = code;
    d->bits = bits;
    d->lanes = 1;
    d->shape = sizes.data();
    d->strides = strides.data();
    d->byte_offset = 0;
    return (impl->requires_grad() || impl->is_neg() || impl->is_conj()) ? 1 : 0;
} catch (const std::exception &) {
    return 2;
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

/* The CUDA caching allocator, as the storage of a tensor at::empty_strided made reports it
 * (learned at the first CUDA allocation): a later CUDA tensor is made by the function
 * at::empty_strided's CUDA kernel calls (at::detail::empty_strided_generic: the
 * allocator's block on the current device and stream, a resizable storage, the CUDA key,
 * the size checks), without the dispatcher and the options' processing. The caller has
 * made the tensor's device current. */
static c10::Allocator *cuda_allocator;

/* torch.OutOfMemoryError (set at import; else RuntimeError): what torch raises when the
 * caching allocator cannot allocate, so callers that catch it catch ours too */
static PyObject *oom_error;

static void set_error(const std::exception &e) {
    const bool oom = dynamic_cast<const c10::OutOfMemoryError *>(&e) != nullptr;
    PyErr_SetString(oom && oom_error ? oom_error : PyExc_RuntimeError, e.what());
}

static PyObject *alloc(int ndim, const int64_t *size, const int64_t *stride, int scalar_type,
                       int device_type, int device_index, int zeroed, void **data) {
    try {
        const c10::IntArrayRef sizes(size, static_cast<size_t>(ndim)), strides(stride, ndim);
        if (cuda_allocator && !zeroed && device_type == static_cast<int>(c10::DeviceType::CUDA)) {
            at::TensorBase b = at::detail::empty_strided_generic(
                sizes, strides, cuda_allocator, c10::DispatchKeySet(c10::DispatchKey::CUDA),
                static_cast<c10::ScalarType>(scalar_type));
            /* (an empty tensor has no block to say its device: made as below) */
            if (b.storage().data() && b.storage().device().index() == device_index) {
                *data = const_cast<void *>(b.unsafeGetTensorImpl()->data());
                return THPVariable_Wrap(b);
            }
        }
        const auto opt = at::TensorOptions()
                             .dtype(static_cast<c10::ScalarType>(scalar_type))
                             .device(c10::Device(static_cast<c10::DeviceType>(device_type),
                                                 static_cast<c10::DeviceIndex>(device_index)));
        at::Tensor t = zeroed ? at::zeros(sizes, opt) : at::empty_strided(sizes, strides, opt);
        *data = const_cast<void *>(t.unsafeGetTensorImpl()->data());
        if (!cuda_allocator && !zeroed && t.is_cuda() && t.storage().allocator())
            cuda_allocator = t.storage().allocator();
        return THPVariable_Wrap(t);
    } catch (const std::exception &e) {
        set_error(e);
        return nullptr;
    }
}

/* Scratch memory for one call's kernels (a workspace that is not returned): a block of
 * the CUDA caching allocator, as a tensor's would be, without the tensor. Its release
 * returns it to the allocator's pool of the stream it was taken on, so the next use of
 * it is ordered after this call's kernels, as for a temporary tensor of a torch op
 * (graph capture included). get(nbytes, device index, &data): a handle (NULL with a
 * Python error set; NULL without one before the first CUDA allocation, or where the
 * block is not on that device, the current one); put(handle) releases it. */
static void *scratch_get(size_t nbytes, int device_index, void **data) {
    if (!cuda_allocator) return nullptr;
    try {
        auto *block = new c10::DataPtr(cuda_allocator->allocate(nbytes));
        if (!block->get() || block->device().index() != device_index) {
            delete block;
            return nullptr;
        }
        *data = block->get();
        return block;
    } catch (const std::exception &e) {
        set_error(e);
        return nullptr;
    }
}

static void scratch_put(void *handle) { delete static_cast<c10::DataPtr *>(handle); }

struct scratch_fns {
    void *(*get)(size_t, int, void **);
    void (*put)(void *);
};
static scratch_fns scratch = {scratch_get, scratch_put};

/* A CPU tensor over memory the caller owns (size, contiguous strides, dtype), whose
 * release calls free_fn(ctx): what at::from_blob makes, without its std::function
 * context (one heap allocation a tensor). A new reference, or NULL with an error set. */
static PyObject *blob(void *data, int ndim, const int64_t *size, int scalar_type,
                      void (*free_fn)(void *), void *ctx) {
    try {
        const auto dtype = caffe2::TypeMeta::fromScalarType(static_cast<c10::ScalarType>(scalar_type));
        int64_t numel = 1;
        for (int i = 0; i < ndim; i++) numel *= size[i];
        c10::Storage storage(c10::Storage::use_byte_size_t(),
                             static_cast<size_t>(numel) * dtype.itemsize(),
                             c10::DataPtr(data, ctx, free_fn, c10::Device(c10::DeviceType::CPU)),
                             /*allocator=*/nullptr, /*resizable=*/false);
        at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
            std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
        t.unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(size, ndim));
        return THPVariable_Wrap(t);
    } catch (const std::exception &e) {
        set_error(e);
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

/* fn as m's capsule attr, named capsule (a static string: the capsule keeps it); false
 * with an error set */
static bool add_capsule(PyObject *m, const char *attr, const char *capsule, void *fn) {
    PyObject *cap = PyCapsule_New(fn, capsule, nullptr);
    if (!cap || PyModule_AddObject(m, attr, cap)) {
        Py_XDECREF(cap);
        return false;
    }
    return true;
}

PyMODINIT_FUNC PyInit__torchalloc_ext(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return nullptr;
    if (!oom_error) {
        PyObject *torch = PyImport_ImportModule("torch");
        oom_error = torch ? PyObject_GetAttrString(torch, "OutOfMemoryError") : nullptr;
        Py_XDECREF(torch);
        if (!oom_error) PyErr_Clear(); /* (RuntimeError then) */
    }
    /* plain and view read a tensor through its Python object: where the layout checks */
    const bool head = head_matches();
#define CAPSULE(f) add_capsule(m, #f, "rl_triton_core._torchalloc." #f, reinterpret_cast<void *>(&f))
    const bool ok = add_capsule(m, "alloc", "rl_triton_core._torchalloc.alloc2",
                                reinterpret_cast<void *>(&alloc)) &&
                    CAPSULE(blob) && CAPSULE(scratch) && (!head || (CAPSULE(plain) && CAPSULE(view)));
#undef CAPSULE
    if (!ok) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
