#pragma once

// The router: one slot per ATen overload, each pointing at a provider.
// The per-call path is an array index and an atomic load.

#include <flagos/Provider.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flagos {

// Slot of an overload name ("add.Tensor", "aten::add.Tensor" or a custom
// "ns::op.overload"), or nullopt if the dispatcher does not know it.
FLAGOS_API std::optional<size_t> slotOf(const std::string& overload);
FLAGOS_API std::string slotName(size_t slot);
// The name routes use for an overload: "add.Tensor", custom ones "ns::op.overload".
FLAGOS_API std::string overloadName(const c10::OperatorHandle& op);
FLAGOS_API std::string overloadName(const std::string& qualified); // drops "aten::"

// Provider serving an overload now (resolving its default if not yet called).
FLAGOS_API std::string routeOf(const std::string& overload);
// Where the route came from: "default", "api", ... (conf layers add more).
FLAGOS_API std::string routeLayerOf(const std::string& overload);
// Why setRoute(overload, provider) would be refused ("" when it would not):
// confs check every route with it before applying any.
FLAGOS_API std::string routeRefusal(const std::string& overload, const std::string& provider);
FLAGOS_API void setRoute(
    const std::string& overload,
    const std::string& provider,
    const std::string& layer);
FLAGOS_API void clearRoute(const std::string& overload);
// The provider every unrouted overload goes to (the active runtime's native
// provider); cpu_fallback serves what that one cannot.
FLAGOS_API void setDefaultProvider(const std::string& provider);
// Its name ("" before a runtime sets one).
FLAGOS_API std::string defaultProviderName();

// Every overload that has a slot now (generated ones first).
FLAGOS_API std::vector<std::string> slotNames();
// Whether `provider` has a kernel for `overload`.
FLAGOS_API bool canServe(const std::string& overload, const std::string& provider);
// Composite ops run whole on the native device without autograd
// (codegen/whole_ops.txt): the switch (on by default; FLAGOS_WHOLE_OPS=0),
// and whether they do now (the switch on, the default provider a relabel
// provider, no route they could bypass).
FLAGOS_API void setWholeOps(bool enabled);
FLAGOS_API bool wholeOpsOn();
// FLAGOS_LOG_DISPATCH: log each call as `overload -> provider` on stderr.
FLAGOS_API void setLogDispatch(bool enabled);

// Tracing: counts per (overload, provider) while at least one trace is open.
// A trace opened inside another gets the counts so far (empty for the first,
// which starts them from zero), so it can count only its own calls; the end
// of a trace gives the counts at its end.
using TraceCounts = std::map<std::pair<std::string, std::string>, uint64_t>;
FLAGOS_API TraceCounts traceBegin();
FLAGOS_API TraceCounts traceEnd();

} // namespace flagos
