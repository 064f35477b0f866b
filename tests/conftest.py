import pytest

import flagos_core  # noqa: F401  (registers the device even with autoload off)
import native_reference


def _has_accelerator_runtime():
    return flagos_core.runtime()["name"] != "host"


def pytest_collection_modifyitems(config, items):
    if _has_accelerator_runtime():
        return
    skip = pytest.mark.skip(reason="needs an accelerator plugin and its hardware (flagos runs on the host runtime here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def native_device():
    """The device flagos results are compared with: CPU on the host runtime."""
    return native_reference.native_device()
