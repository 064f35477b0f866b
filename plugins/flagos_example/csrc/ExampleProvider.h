#pragma once

namespace flagos::example {

// Registers the `example_cpp` kernel provider with the core's router.
void registerExampleProvider();

} // namespace flagos::example
