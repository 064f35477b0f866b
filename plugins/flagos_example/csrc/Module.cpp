// The plugin's Python extension, flagos_example._C. plugin.py imports it only
// after the core has accepted the plugin's build facts (_build_info.py).

#include "ExampleProvider.h"

#include <flagos/Export.h>

#include <pybind11/pybind11.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "flagos-example bindings";
  m.attr("PLUGIN_ABI_VERSION") = flagos::kPluginAbiVersion;
  m.def("register_example_provider", &flagos::example::registerExampleProvider);
}
