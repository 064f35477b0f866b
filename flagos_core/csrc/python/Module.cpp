// flagos_core._C: the Python face of libflagos_core.

#include <flagos/Router.h>
#include <flagos/Runtime.h>

#include "core/Autocast.h"
#include "core/Collectives.h"
#include "core/ProcessSharing.h"
#include "host/HostRuntime.h"
#include "python/CompiledCalls.h"
#include "python/CrashBacktrace.h"
#include "python/PythonProvider.h"
#include "python/RecurrentSteps.h"
#include <flagos/Relabel.h>

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace flagos {
void registerCpuFallbackProvider();

namespace {

// The allocator's statistics under torch.cuda.memory_stats()'s keys (all of
// them, so code written for CUDA reads them unchanged): each count and size
// as "<name>.<all|small_pool|large_pool>.<current|peak|allocated|freed>".
py::dict statsDict(c10::DeviceIndex index) {
  using c10::CachingDeviceAllocator::StatType;
  DeviceRuntime& rt = activeRuntime();
  rt.checkIndex(index);
  const auto stats = rt.allocator()->getDeviceStats(index);
  py::dict out;
  auto addStat = [&](const std::string& prefix, const c10::CachingDeviceAllocator::Stat& s) {
    out[py::str(prefix + ".current")] = s.current;
    out[py::str(prefix + ".peak")] = s.peak;
    out[py::str(prefix + ".allocated")] = s.allocated;
    out[py::str(prefix + ".freed")] = s.freed;
  };
  auto add = [&](const std::string& name, const c10::CachingDeviceAllocator::StatArray& array) {
    addStat(name + ".all", array[static_cast<size_t>(StatType::AGGREGATE)]);
    addStat(name + ".small_pool", array[static_cast<size_t>(StatType::SMALL_POOL)]);
    addStat(name + ".large_pool", array[static_cast<size_t>(StatType::LARGE_POOL)]);
  };
  add("allocation", stats.allocation);
  add("segment", stats.segment);
  add("active", stats.active);
  add("inactive_split", stats.inactive_split);
  add("allocated_bytes", stats.allocated_bytes);
  add("reserved_bytes", stats.reserved_bytes);
  add("active_bytes", stats.active_bytes);
  add("inactive_split_bytes", stats.inactive_split_bytes);
  add("requested_bytes", stats.requested_bytes);
  addStat("oversize_allocations", stats.oversize_allocations);
  addStat("oversize_segments", stats.oversize_segments);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  out["max_split_size"] = stats.max_split_size;
  return out;
}

} // namespace
} // namespace flagos

PYBIND11_MODULE(_C, m) {
  using namespace flagos;
  m.doc() = "flagos core bindings";
  m.def("_install_crash_backtrace", &installCrashBacktrace);
  // Our own translation of c10::Error, so errors from these bindings do not
  // depend on torch's translator being visible across pybind11 builds.
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) {
        std::rethrow_exception(error);
      }
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  m.attr("PLUGIN_ABI_VERSION") = kPluginAbiVersion;

  m.def("_activate_host_runtime", [](int devices) {
    host::activateHostRuntime(static_cast<c10::DeviceIndex>(devices));
  });
  m.def("_register_cpu_fallback", &registerCpuFallbackProvider);
  m.def("_register_python_provider", &registerPythonProvider);
  m.def("_gru_steps", &gruSteps, py::call_guard<py::gil_scoped_release>());
  m.def("_lstm_steps", &lstmSteps, py::call_guard<py::gil_scoped_release>());
  m.def("_to_native", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "flagos: as_native needs a flagos tensor, got ", t.device());
    return toNative(t, activeRuntime().nativeDevice(t.device().index()));
  });
  m.def("_from_native", [](const at::Tensor& t, int index) {
    activeRuntime().checkIndex(static_cast<c10::DeviceIndex>(index));
    TORCH_CHECK(t.device().type() == activeRuntime().nativeDeviceType(), "flagos: from_native needs a ",
                c10::DeviceTypeName(activeRuntime().nativeDeviceType(), true), " tensor, got ", t.device());
    return adoptNative(t, static_cast<c10::DeviceIndex>(index));
  });
  m.def("_native_arguments_in_place", &nativeArgumentsInPlace);
  m.def("_flagos_results_in_place", &flagosResultsInPlace);
  m.def("_serve_collectives", &serveCollectives);
  m.def("_wrapped_native_bytes", &wrappedNativeBytes);
  m.def("_move_storage_onto", &moveStorageOnto);
  m.def("_use_autocast_policies", &useAutocastPolicies);
  m.def("_autocast_policies", &autocastPolicies);
  m.def("_has_runtime", &hasActiveRuntime);
  m.def("_runtime_name", [] { return activeRuntime().name(); });
  m.def("_native_device_type", [] { return c10::DeviceTypeName(activeRuntime().nativeDeviceType(), true); });
  // The native device that flagos device `index` aliases, as its tensors name it (CPU's has no index).
  m.def("_native_device", [](int index) { return activeRuntime().nativeDevice(static_cast<c10::DeviceIndex>(index)); });
  m.def("_device_count", [] { return hasActiveRuntime() ? static_cast<int>(activeRuntime().deviceCount()) : 0; });
  m.def("_current_device", [] { return static_cast<int>(activeRuntime().getDevice().index()); });
  m.def("_set_device", [](int index) {
    activeRuntime().setDevice(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
  });
  m.def("_synchronize", [](int index) {
    py::gil_scoped_release no_gil;
    activeRuntime().synchronizeDevice(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_device_properties", [](int index) {
    auto p = activeRuntime().properties(static_cast<c10::DeviceIndex>(index));
    return py::make_tuple(p.name, p.total_memory, p.major, p.minor, p.multi_processor_count);
  });
  m.def("_default_generator", [](int index) {
    return activeRuntime().defaultGenerator(static_cast<c10::DeviceIndex>(index));
  });

  m.def("_memory_stats", [](int index) { return statsDict(static_cast<c10::DeviceIndex>(index)); });
  m.def("_reset_peak_memory_stats", [](int index) {
    activeRuntime().allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_reset_accumulated_memory_stats", [](int index) {
    activeRuntime().allocator()->resetAccumulatedStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_mem_get_info", [](int index) {
    activeRuntime().checkIndex(static_cast<c10::DeviceIndex>(index));
    return activeRuntime().allocator()->getMemoryInfo(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_empty_cache", [] { activeRuntime().allocator()->emptyCache(); });

  m.def("_providers", &providerNames);
  m.def("_default_provider", &defaultProviderName);
  m.def("_route", &routeOf);
  m.def("_route_layer", &routeLayerOf);
  m.def("_set_route", &setRoute);
  m.def("_route_refusal", &routeRefusal);
  m.def("_clear_route", &clearRoute);
  m.def("_slot_names", &slotNames);
  m.def("_can_serve", &canServe);
  m.def("_set_log_dispatch", &setLogDispatch);
  m.def("_set_whole_ops", &setWholeOps);
  m.def("_whole_ops_on", &wholeOpsOn);
  auto as_dict = [](const TraceCounts& counts) {
    py::dict out;
    for (const auto& [key, count] : counts) {
      out[py::make_tuple(key.first, key.second)] = count;
    }
    return out;
  };
  m.def("_trace_begin", [as_dict] { return as_dict(traceBegin()); });
  m.def("_trace_end", [as_dict] { return as_dict(traceEnd()); });
}
