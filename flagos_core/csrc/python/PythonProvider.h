#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace flagos {

// Registers a provider whose kernels are Python callables, by overload name.
void registerPythonProvider(const std::string& name, const pybind11::dict& kernels);

} // namespace flagos
