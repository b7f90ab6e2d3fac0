// ndist's compiled torch backend and custom ops (docs/torch.md, "The compiled backend").
//
// Built against the installed torch by ndist/torch/_compiled.py (torch.utils.cpp_extension.load,
// once per torch version, ndist version and source; cached). Two things:
//
// * NdistBackend, a c10d::Backend over a Python ProcessGroupNdist (``py_``): allreduce,
//   broadcast, _allgather_base, _reduce_scatter_base, alltoall_base (even, and with split sizes
//   through the table's all_to_all_v where the module has it) and barrier
//   called blocking (``opts.asyncOp`` false: torch waits at once) on dense contiguous CPU
//   tensors call ndist's engine through its C interface (ndist_engine.h) on the caller's
//   thread and return a completed Work; every other op, and every call the C interface does
//   not cover (async_op=True, DDP's buckets and the functional collectives, which the Python
//   group runs in the background; no handle: the Python engine, the mpi backend, a group
//   that has not run a collective yet; coalescing; PREMUL_SUM; other layouts), calls the
//   Python group's method of the same name, so torch sees one backend. torch.distributed's
//   shrink_group shrinks the Python group and wraps the result in a new NdistBackend.
// * torch.ops.ndist.all_reduce_ / broadcast_ / all_gather_into, found by torch's group name,
//   for inference code that calls collectives inside a model (DeepSpeed's
//   inference_all_reduce_), with Meta kernels so torch.compile(fullgraph=True) traces them.
//
// The engine's C interface takes no GIL for a call its C core runs that succeeds (clane.c's
// core, on C11 atomics; docs/native.md, "Threads and the GIL"), so a Python thread holding the
// GIL does not hold torch's call up; a call into the Python group takes the GIL here.

#include <torch/extension.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "ndist_engine.h"

namespace py = pybind11;

namespace ndist_torch {

// ------------------------------------------------------------------------ the engine's table
static const ndist_engine_api* g_api = nullptr;

// The table, from the capsule (the GIL held: at module import).
static void load_api() {
  // PyCapsule_Import imports the package and reads attributes: the extension module first
  py::module_::import("ndist.collectives.backends.socket.native._cnative");
  auto* api = static_cast<const ndist_engine_api*>(PyCapsule_Import(NDIST_ENGINE_CAPSULE, 0));
  if (api == nullptr) throw py::error_already_set();
  if (api->version != NDIST_ENGINE_API_VERSION) {
    throw std::runtime_error("ndist's engine C interface has version " + std::to_string(api->version) +
                             ", this backend was built for " + std::to_string(NDIST_ENGINE_API_VERSION));
  }
  g_api = api;
}

// ndist_torch's Python helpers (ndist/torch/_compiled.py), imported once with the GIL.
static py::object helpers() {
  static py::object* mod = nullptr;
  if (mod == nullptr) mod = new py::object(py::module_::import("ndist.torch._compiled"));
  return *mod;
}

static int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBool: return NDIST_BOOL;
    case at::kChar: return NDIST_INT8;
    case at::kByte: return NDIST_UINT8;
    case at::kShort: return NDIST_INT16;
    case at::kUInt16: return NDIST_UINT16;
    case at::kInt: return NDIST_INT32;
    case at::kUInt32: return NDIST_UINT32;
    case at::kLong: return NDIST_INT64;
    case at::kUInt64: return NDIST_UINT64;
    case at::kHalf: return NDIST_FLOAT16;
    case at::kFloat: return NDIST_FLOAT32;
    case at::kDouble: return NDIST_FLOAT64;
    case at::kComplexFloat: return NDIST_COMPLEX64;
    case at::kComplexDouble: return NDIST_COMPLEX128;
    case at::kBFloat16: return NDIST_BFLOAT16;
    case at::kFloat8_e4m3fn: return NDIST_FLOAT8_E4M3FN;
    case at::kFloat8_e5m2: return NDIST_FLOAT8_E5M2;
    default: return 0;
  }
}

// The engine's dtype code of a tensor it can take as is (a dense, contiguous, non-empty CPU
// tensor, not a lazily conjugated or negated view), else 0.
static int engine_dtype(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || !t.is_contiguous() ||
      t.is_conj() || t.is_neg() || t.numel() == 0)
    return 0;
  return dtype_code(t);
}

static int redop_code(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return NDIST_SUM;
    case c10d::ReduceOp::PRODUCT: return NDIST_PRODUCT;
    case c10d::ReduceOp::MIN: return NDIST_MIN;
    case c10d::ReduceOp::MAX: return NDIST_MAX;
    case c10d::ReduceOp::AVG: return NDIST_AVG;
    case c10d::ReduceOp::BAND: return NDIST_BAND;
    case c10d::ReduceOp::BOR: return NDIST_BOR;
    case c10d::ReduceOp::BXOR: return NDIST_BXOR;
    default: return 0;  // PREMUL_SUM: the Python group's
  }
}

// A bad argument the engine refused before anything was sent: the Python path's ValueError /
// TypeError, raised from the op itself.
[[noreturn]] static void throw_argument(const ndist_error& err) {
  if (std::string(err.type) == "TypeError") throw c10::TypeError({__func__, __FILE__, __LINE__}, err.message);
  throw c10::ValueError({__func__, __FILE__, __LINE__}, err.message);
}

// ------------------------------------------------------------------------------------ Works
// The Work of an op the engine already ran: complete, with its outputs.
class DoneWork : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> outputs, c10d::OpType type) : c10d::Work(-1, type), outputs_(std::move(outputs)) {}

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::exception_ptr exception() const override { return nullptr; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::call_once(once_, [this] {
      fut_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      fut_->markCompleted(c10::IValue(outputs_));
    });
    return fut_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  std::once_flag once_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

// A Python ndist Work (ndist.torch.NdistWork) held from C++: every query goes to the Python
// object (a Python Work overrides only wait and get_future in C++), which this keeps alive.
class HeldWork : public c10d::Work {
 public:
  explicit HeldWork(py::object work) : work_(work.cast<c10::intrusive_ptr<c10d::Work>>()), py_(std::move(work)) {}

  ~HeldWork() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      py_ = py::object();
    } else {
      py_.release();  // the interpreter is gone: nothing left to free it with
    }
  }

  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_success")().cast<bool>();
  }
  // The Python Work's exception as the C++ error torch turns back into the same Python class.
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object exc = py_.attr("exception")();
    if (exc.is_none()) return nullptr;
    std::string msg = py::str(exc).cast<std::string>();
    py::module_ tdist = py::module_::import("torch.distributed");
    c10::SourceLocation here{__func__, __FILE__, __LINE__};
    if (py::isinstance(exc, tdist.attr("DistNetworkError")))
      return std::make_exception_ptr(c10::DistNetworkError(here, msg));
    if (py::isinstance(exc, tdist.attr("DistStoreError")))
      return std::make_exception_ptr(c10::DistStoreError(here, msg));
    if (py::isinstance(exc, tdist.attr("DistError")))
      return std::make_exception_ptr(c10::DistBackendError(here, msg));
    return std::make_exception_ptr(c10::Error(here, msg));
  }
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("_source_rank")().cast<int>();
  }
  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return py_.attr("result")().cast<std::vector<at::Tensor>>();
  }
  void synchronize() override { wait(kNoTimeout); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object py_;
};

// ---------------------------------------------------------------------------------- backend
class NdistBackend : public c10d::Backend {
 public:
  NdistBackend(py::object group, int rank, int size) : c10d::Backend(rank, size), py_(std::move(group)) {}

  ~NdistBackend() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      py_ = py::object();
    } else {
      py_.release();
    }
  }

  const std::string getBackendName() const override { return "ndist"; }
  bool supportsCoalescing() const override { return true; }

  // The engine's handle, or 0 while none (a call then goes to the Python group).
  ndist_group handle() const { return coalescing_ ? 0 : handle_.load(std::memory_order_acquire); }

  // Calls that went through the engine (tests and docs read it: ndist.torch.ops.engine_calls),
  // the custom ops' included.
  uint64_t engine_calls() const { return engine_calls_.load(); }
  void count_engine_call() { engine_calls_.fetch_add(1, std::memory_order_relaxed); }

  py::object python_group() const { return py_; }

  // -------------------------------------------------------------- mapped ops
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    ndist_group h = handle();
    int dt, op;
    if (h != 0 && !opts.asyncOp && tensors.size() == 1 && (dt = engine_dtype(tensors[0])) != 0 &&
        (op = redop_code(opts.reduceOp)) != 0) {
      ndist_error err;
      int st = g_api->all_reduce(h, tensors[0].data_ptr(), tensors[0].numel(), dt, op, &err);
      return finish(st, err, tensors, c10d::OpType::ALLREDUCE, "allreduce");
    }
    return fallback(tensors, "allreduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    ndist_group h = handle();
    int dt;
    if (h != 0 && !opts.asyncOp && tensors.size() == 1 && opts.rootTensor == 0 &&
        (dt = engine_dtype(tensors[0])) != 0) {
      ndist_error err;
      int st = g_api->broadcast(h, tensors[0].data_ptr(), tensors[0].numel(), dt, static_cast<int>(opts.rootRank), &err);
      return finish(st, err, tensors, c10d::OpType::BROADCAST, "broadcast");
    }
    return fallback(tensors, "broadcast", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    ndist_group h = handle();
    int dt;
    if (h != 0 && !opts.asyncOp && (dt = engine_dtype(input)) != 0 && engine_dtype(output) == dt &&
        output.numel() == input.numel() * getSize()) {
      ndist_error err;
      int st = g_api->all_gather(h, output.data_ptr(), input.data_ptr(), input.numel(), dt, &err);
      std::vector<at::Tensor> outs{output};
      return finish(st, err, outs, c10d::OpType::_ALLGATHER_BASE, "all_gather_single");
    }
    std::vector<at::Tensor> outs{output};
    return fallback(outs, "_allgather_base", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    ndist_group h = handle();
    int dt, op;
    if (h != 0 && !opts.asyncOp && (dt = engine_dtype(input)) != 0 && engine_dtype(output) == dt &&
        input.numel() == output.numel() * getSize() && (op = redop_code(opts.reduceOp)) != 0) {
      ndist_error err;
      int st = g_api->reduce_scatter(h, output.data_ptr(), input.data_ptr(), output.numel(), dt, op, &err);
      std::vector<at::Tensor> outs{output};
      return finish(st, err, outs, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_single");
    }
    std::vector<at::Tensor> outs{output};
    return fallback(outs, "_reduce_scatter_base", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override {
    ndist_group h = handle();
    int dt;
    if (h != 0 && !opts.asyncOp && outputSplitSizes.empty() && inputSplitSizes.empty() &&
        (dt = engine_dtype(input)) != 0 &&
        engine_dtype(output) == dt && output.numel() == input.numel() && input.numel() % getSize() == 0) {
      ndist_error err;
      int st = g_api->all_to_all(h, output.data_ptr(), input.data_ptr(), input.numel(), dt, &err);
      std::vector<at::Tensor> outs{output};
      return finish(st, err, outs, c10d::OpType::ALLTOALL_BASE, "all_to_all_single");
    }
    // split sizes (rows of dim 0; an empty list: even rows): the table's all_to_all_v where the module
    // has it, with counts in elements, when the sizes are what the Python group takes (else it raises)
    std::vector<int64_t> counts;
    if (h != 0 && !opts.asyncOp && has_all_to_all_v() && (dt = engine_dtype(input)) != 0 &&
        engine_dtype(output) == dt && output.dim() == input.dim() && input.dim() >= 1 &&
        output.sizes().slice(1) == input.sizes().slice(1) &&
        split_counts(outputSplitSizes, output, counts) && split_counts(inputSplitSizes, input, counts) &&
        counts[getRank()] == counts[getSize() + getRank()]) {
      ndist_error err;
      int st = g_api->all_to_all_v(h, output.data_ptr(), output.numel(), counts.data(), input.data_ptr(),
                                   input.numel(), counts.data() + getSize(), dt, &err);
      std::vector<at::Tensor> outs{output};
      return finish(st, err, outs, c10d::OpType::ALLTOALL_BASE, "all_to_all_single");
    }
    std::vector<at::Tensor> outs{output};
    return fallback(outs, "alltoall_base", output, input, outputSplitSizes, inputSplitSizes, opts);
  }

  // The table has all_to_all_v (appended after the first release: ``size`` says).
  static bool has_all_to_all_v() {
    return g_api->size >= offsetof(ndist_engine_api, all_to_all_v) + sizeof g_api->all_to_all_v;
  }

  // ``splits`` (rows of ``t``'s dim 0; empty: getSize() equal parts) as element counts appended to
  // ``counts``: false where the Python group would refuse them (a size, a negative or a sum that
  // does not match), so that it raises its own error.
  bool split_counts(const std::vector<int64_t>& splits, const at::Tensor& t, std::vector<int64_t>& counts) const {
    int n = getSize();
    int64_t rows = t.size(0), row = rows ? t.numel() / rows : 0;
    if (splits.empty()) {
      if (rows % n) return false;
      counts.insert(counts.end(), n, rows / n * row);
      return true;
    }
    if (static_cast<int64_t>(splits.size()) != n) return false;
    int64_t total = 0;
    for (int64_t s : splits) {
      if (s < 0 || s > rows - total) return false;
      total += s;
      counts.push_back(s * row);
    }
    return total == rows;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    ndist_group h = handle();
    if (h != 0 && !opts.asyncOp) {
      ndist_error err;
      int st = g_api->barrier(h, &err);
      std::vector<at::Tensor> none;
      return finish(st, err, none, c10d::OpType::BARRIER, "barrier");
    }
    std::vector<at::Tensor> none;
    return fallback(none, "barrier", opts);
  }

  // ------------------------------------------------- the Python group's ops
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return fallback(tensors, "allreduce_coalesced", tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return fallback(tensors, "reduce", tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return fallback(inputs, "allgather", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return fallback(inputs, "allgather_coalesced", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    return fallback(outputs, "allgather_into_tensor_coalesced", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    return fallback(inputs, "gather", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return fallback(outputs, "scatter", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return fallback(outputs, "reduce_scatter", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    return fallback(outputs, "reduce_scatter_tensor_coalesced", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return fallback(outputs, "alltoall", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override {
    return fallback(tensors, "send", tensors, dstRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override {
    return fallback(tensors, "recv", tensors, srcRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return fallback(tensors, "recv_anysource", tensors, tag);
  }

  // Coalesced ops share one Work on the Python group: every op goes there meanwhile.
  void startCoalescing() override {
    py::gil_scoped_acquire gil;
    py_.attr("start_coalescing")(py::none());
    coalescing_ = true;
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    py::gil_scoped_acquire gil;
    coalescing_ = false;
    return held(py_.attr("end_coalescing")(py::none()), {});
  }

  // torch.distributed.shrink_group: the Python group shrinks (ndist/torch/_shrink.py: the
  // survivors' agreement through the group's store) and the new group gets a backend like this
  // one. torch reaches them from Python (the NdistBackend class below: torch 2.13's Backend
  // binds neither); a compiled backend is only made for the socket engine, which shrinks.
  bool supportsShrinking() const override { return true; }

  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& /*opts_override*/) override {
    py::gil_scoped_acquire gil;
    // (C++ callers have torch's Backend::Options; ndist's are Python: the group's own then)
    return shrink_py(ranks_to_exclude, shrink_flags, py::none());
  }

  // The shrunk group's backend (the GIL held): ``ndist.torch._shrink.shrink_compiled``.
  c10::intrusive_ptr<c10d::Backend> shrink_py(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                              py::object pg_options) {
    py::object out = py::module_::import("ndist.torch._shrink")
                         .attr("shrink_compiled")(py_, ranks_to_exclude, shrink_flags, pg_options);
    return out.cast<c10::intrusive_ptr<c10d::Backend>>();
  }

  void shutdown() override {
    py::gil_scoped_acquire gil;
    py_.attr("shutdown")();
  }
  void abort() override {
    py::gil_scoped_acquire gil;
    py_.attr("abort")();
  }

 private:
  // The Work for the engine's status: complete, failed (the Python backend's NdistWork with the
  // same error) or, for a bad argument, an exception now.
  c10::intrusive_ptr<c10d::Work> finish(int status, const ndist_error& err, std::vector<at::Tensor>& outputs,
                                        c10d::OpType type, const char* op) {
    if (status == NDIST_OK) {
      engine_calls_.fetch_add(1, std::memory_order_relaxed);
      return c10::make_intrusive<DoneWork>(outputs, type);
    }
    if (status == NDIST_E_ARGUMENT) throw_argument(err);
    py::gil_scoped_acquire gil;
    py::object work = helpers().attr("failed_work")(py_, outputs, op, err.type, err.rank, err.message);
    return held(work, outputs);
  }

  // The Python group's method ``name``; a None it returns (torch's own caller, ``_WAITS``) is
  // a complete Work. Learns the engine's handle once the group has one.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> fallback(const std::vector<at::Tensor>& outputs, const char* name, Args&&... args) {
    py::gil_scoped_acquire gil;
    py::object work = py_.attr(name)(std::forward<Args>(args)...);
    learn_handle();
    return held(work, outputs);
  }

  c10::intrusive_ptr<c10d::Work> held(py::object work, const std::vector<at::Tensor>& outputs) {
    if (work.is_none()) return c10::make_intrusive<DoneWork>(outputs, c10d::OpType::UNKNOWN);
    return c10::make_intrusive<HeldWork>(std::move(work));
  }

  // The GIL held: ask the Python group for the engine's handle until it has one (its first
  // collective sets the engine up) or says it never will (-1).
  void learn_handle() {
    if (handle_state_ != 0) return;
    long long h = helpers().attr("engine_handle")(py_).cast<long long>();
    if (h > 0) {
      handle_.store(static_cast<ndist_group>(h), std::memory_order_release);
      handle_state_ = 1;
    } else if (h < 0) {
      handle_state_ = -1;
    }
  }

  py::object py_;
  std::atomic<ndist_group> handle_{0};
  int handle_state_ = 0;  // 0: not known yet, 1: handle_ set, -1: never (the Python group's ops only)
  bool coalescing_ = false;
  std::atomic<uint64_t> engine_calls_{0};
};

// The torch group of a group whose only backend is ndist's: torch's ProcessGroup with the backend
// for the CPU, named "ndist" (a custom backend's group calls itself "custom" otherwise, and DDP's
// logging reports that name).
class NdistProcessGroup : public c10d::ProcessGroup {
 public:
  NdistProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    const c10::intrusive_ptr<c10d::Backend>& backend)
      : c10d::ProcessGroup(store, rank, size) {
    setBackend(c10::DeviceType::CPU, BackendType::CUSTOM, backend);
    setDefaultBackend(BackendType::CUSTOM);
  }

  const std::string getBackendName() const override { return "ndist"; }
};

static c10::intrusive_ptr<c10d::Backend> create_backend(py::object group, int rank, int size) {
  return c10::make_intrusive<NdistBackend>(std::move(group), rank, size);
}

static NdistBackend* as_ndist(const c10::intrusive_ptr<c10d::Backend>& backend) {
  return dynamic_cast<NdistBackend*>(backend.get());
}

// --------------------------------------------------------------------------------- custom ops
// The group torch names ``group_name``, and its NdistBackend for the CPU if it has one.
static NdistBackend* ndist_backend_of(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  try {
    return as_ndist(pg->getBackend(c10::DeviceType::CPU));
  } catch (const c10::Error&) {
    return nullptr;
  }
}

// An engine failure as the Python backend raises it from wait(): torch's DistNetworkError /
// DistBackendError naming the peer (ndist/torch/_compiled.py, raise_engine_error).
[[noreturn]] static void raise_engine_error(const ndist_error& err, NdistBackend* nb) {
  if (err.status == NDIST_E_ARGUMENT) throw_argument(err);
  py::gil_scoped_acquire gil;
  helpers().attr("raise_engine_error")(err.type, err.rank, err.message, nb->python_group());
  throw std::logic_error("raise_engine_error returned");  // not reached: it raises
}

static int parse_op(c10::string_view op) {
  if (op == "sum") return NDIST_SUM;
  if (op == "avg") return NDIST_AVG;
  if (op == "product") return NDIST_PRODUCT;
  if (op == "min") return NDIST_MIN;
  if (op == "max") return NDIST_MAX;
  if (op == "band") return NDIST_BAND;
  if (op == "bor") return NDIST_BOR;
  if (op == "bxor") return NDIST_BXOR;
  throw c10::ValueError({__func__, __FILE__, __LINE__},
                        "op: expected one of 'sum', 'avg', 'product', 'min', 'max', 'band', 'bor', 'bxor', got '" +
                            std::string(op) + "'");
}

static c10d::ReduceOp torch_op(int code) {
  switch (code) {
    case NDIST_SUM: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case NDIST_AVG: return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case NDIST_PRODUCT: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case NDIST_MIN: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case NDIST_MAX: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case NDIST_BAND: return c10d::ReduceOp(c10d::ReduceOp::BAND);
    case NDIST_BOR: return c10d::ReduceOp(c10d::ReduceOp::BOR);
    default: return c10d::ReduceOp(c10d::ReduceOp::BXOR);
  }
}

// Waits for a Work from a group's own op, without the GIL (a backend's wait may block).
static void wait_released(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    work->wait();
  } else if (work) {
    work->wait();
  }
}

at::Tensor& all_reduce_(at::Tensor& t, c10::string_view group_name, c10::string_view op) {
  int code = parse_op(op);
  auto pg = c10d::resolve_process_group(std::string(group_name));
  NdistBackend* nb = ndist_backend_of(pg);
  int dt = engine_dtype(t);
  ndist_group h = nb != nullptr ? nb->handle() : 0;
  if (h != 0 && dt != 0) {
    ndist_error err;
    if (g_api->all_reduce(h, t.data_ptr(), t.numel(), dt, code, &err) != NDIST_OK) raise_engine_error(err, nb);
    nb->count_engine_call();
    return t;
  }
  // any other group or tensor: the group's own allreduce (a non-contiguous tensor through a copy)
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> ts{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = torch_op(code);
  wait_released(pg->allreduce(ts, opts));
  if (!buf.is_same(t)) t.copy_(buf);
  return t;
}

at::Tensor& broadcast_(at::Tensor& t, int64_t src, c10::string_view group_name) {
  auto pg = c10d::resolve_process_group(std::string(group_name));
  if (src < 0 || src >= pg->getSize())
    throw c10::ValueError({__func__, __FILE__, __LINE__}, "src: expected a group rank in [0, " +
                                                              std::to_string(pg->getSize()) + "), got " +
                                                              std::to_string(src));
  NdistBackend* nb = ndist_backend_of(pg);
  int dt = engine_dtype(t);
  ndist_group h = nb != nullptr ? nb->handle() : 0;
  if (h != 0 && dt != 0) {
    ndist_error err;
    if (g_api->broadcast(h, t.data_ptr(), t.numel(), dt, static_cast<int>(src), &err) != NDIST_OK)
      raise_engine_error(err, nb);
    nb->count_engine_call();
    return t;
  }
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> ts{buf};
  c10d::BroadcastOptions opts;
  opts.rootRank = src;
  wait_released(pg->broadcast(ts, opts));
  if (!buf.is_same(t)) t.copy_(buf);
  return t;
}

at::Tensor& all_gather_into(at::Tensor& out, const at::Tensor& t, c10::string_view group_name) {
  auto pg = c10d::resolve_process_group(std::string(group_name));
  if (out.numel() != t.numel() * pg->getSize())
    throw c10::ValueError({__func__, __FILE__, __LINE__},
                          "out: expected " + std::to_string(t.numel() * pg->getSize()) +
                              " elements (the group size times the input's), got " + std::to_string(out.numel()));
  if (out.scalar_type() != t.scalar_type())
    throw c10::TypeError({__func__, __FILE__, __LINE__}, std::string("out: expected dtype ") +
                                                             c10::toString(t.scalar_type()) + " (the input's), got " +
                                                             c10::toString(out.scalar_type()));
  NdistBackend* nb = ndist_backend_of(pg);
  int dt = engine_dtype(t);
  ndist_group h = nb != nullptr ? nb->handle() : 0;
  if (h != 0 && dt != 0 && engine_dtype(out) == dt) {
    ndist_error err;
    if (g_api->all_gather(h, out.data_ptr(), t.data_ptr(), t.numel(), dt, &err) != NDIST_OK) raise_engine_error(err, nb);
    nb->count_engine_call();
    return out;
  }
  at::Tensor buf = out.is_contiguous() ? out : out.contiguous();
  at::Tensor in = t.contiguous();
  wait_released(pg->_allgather_base(buf, in, c10d::AllgatherOptions()));
  if (!buf.is_same(out)) out.copy_(buf);
  return out;
}

// Meta kernels (torch.compile's fake tensors): the outputs alias the mutated inputs.
at::Tensor& all_reduce_meta(at::Tensor& t, c10::string_view, c10::string_view) { return t; }
at::Tensor& broadcast_meta(at::Tensor& t, int64_t, c10::string_view) { return t; }
at::Tensor& all_gather_into_meta(at::Tensor& out, const at::Tensor&, c10::string_view) { return out; }

}  // namespace ndist_torch

TORCH_LIBRARY(ndist, m) {
  m.def("all_reduce_(Tensor(a!) t, str group_name, str op='sum') -> Tensor(a!)", {at::Tag::inplace});
  m.def("broadcast_(Tensor(a!) t, int src, str group_name) -> Tensor(a!)", {at::Tag::inplace});
  m.def("all_gather_into(Tensor(a!) out, Tensor t, str group_name) -> Tensor(a!)", {at::Tag::inplace});
}

TORCH_LIBRARY_IMPL(ndist, CPU, m) {
  m.impl("all_reduce_", &ndist_torch::all_reduce_);
  m.impl("broadcast_", &ndist_torch::broadcast_);
  m.impl("all_gather_into", &ndist_torch::all_gather_into);
}

TORCH_LIBRARY_IMPL(ndist, Meta, m) {
  m.impl("all_reduce_", &ndist_torch::all_reduce_meta);
  m.impl("broadcast_", &ndist_torch::broadcast_meta);
  m.impl("all_gather_into", &ndist_torch::all_gather_into_meta);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");  // torch's Backend and Work types, for the casts
  ndist_torch::load_api();
  // The backend's own Python class (torch hands it out from ``group._get_backend(device)``):
  // what torch's shrink_group asks of a backend in Python, which torch 2.13's Backend lacks.
  py::class_<ndist_torch::NdistBackend, c10d::Backend, c10::intrusive_ptr<ndist_torch::NdistBackend>>(
      m, "NdistBackend", "ndist's compiled c10d Backend (docs/torch.md, \"The compiled backend\").")
      .def_property_readonly("supports_shrinking",
                             [](const ndist_torch::NdistBackend& b) { return b.supportsShrinking(); })
      .def(
          "shrink",
          [](ndist_torch::NdistBackend& b, const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
             py::object pg_options) { return b.shrink_py(ranks_to_exclude, shrink_flags, std::move(pg_options)); },
          py::arg("ranks_to_exclude"), py::arg("shrink_flags") = 0, py::arg("pg_options") = py::none(),
          "The backend of this group less ``ranks_to_exclude`` (torch.distributed.shrink_group).");
  m.doc() = "ndist's compiled torch backend and custom ops (built by ndist.torch._compiled)";
  m.def("create_backend", &ndist_torch::create_backend, py::arg("group"), py::arg("rank"), py::arg("size"),
        "A c10d Backend over the Python ProcessGroupNdist ``group``.");
  py::class_<ndist_torch::NdistProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<ndist_torch::NdistProcessGroup>>(
      m, "NdistProcessGroup", "torch's group of a group on ndist's compiled backend alone, named \"ndist\".");
  m.def(
      "create_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const c10::intrusive_ptr<c10d::Backend>& backend) -> c10::intrusive_ptr<c10d::ProcessGroup> {
        return c10::make_intrusive<ndist_torch::NdistProcessGroup>(store, rank, size, backend);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"),
      "A torch ProcessGroup named \"ndist\" with ``backend`` for the CPU.");
  m.def(
      "engine_calls",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) -> int64_t {
        auto* nb = ndist_torch::as_ndist(backend);
        return nb == nullptr ? -1 : static_cast<int64_t>(nb->engine_calls());
      },
      "How many ops the backend ran through the engine's C interface (-1: not ndist's compiled backend).");
  m.def(
      "python_group",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) -> py::object {
        auto* nb = ndist_torch::as_ndist(backend);
        return nb == nullptr ? py::none() : nb->python_group();
      },
      "The Python ProcessGroupNdist under ndist's compiled backend (None: not one).");
}
