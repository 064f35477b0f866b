"""AOT autograd's cache for flagos graphs compiled by inductor
(_inductor.py hands them over to the native device).

A second process that compiles the same model finds its work in two
caches: AOT autograd's (the traced forward and backward graphs, split) and
inductor's (the code generated for each). An AOT autograd entry names
inductor's entries of the native graphs, which know nothing of flagos: a
hit alone would run native code on flagos tensors. So an entry made for a
flagos graph also records, per side, what the crossing needs, and a hit puts
the crossing back. Hooked where torch 2.10 to 2.13 make an entry
(AOTAutogradCache.make_entry) and load each side of one
(FxGraphCacheLoadable.load, post_compile); where these are not found, the
cache stays off for flagos graphs.
"""

import torch

from ._inductor import NativeCompiledGraph, _is_flagos, _on_native, _through_flagos, route_of

# What a side's record holds; another format is a miss.
RECORD_FORMAT = 3  # 2: a device index per flagos output; 3: the number slots of ops through flagos


def aot_cache_keeps_the_crossing():
    """Whether AOT autograd's cache may serve flagos graphs: its entries
    (unbundled, they name inductor's cache entries of the native graphs)
    then carry what the crossing needs, and a hit puts the crossing back.
    False where this torch's cache is not the one these
    hooks know, or bundles the compiled code into its entries."""
    try:
        from torch._functorch._aot_autograd import aot_autograd_result, autograd_cache
    except ImportError:
        return False
    if not _CachedCrossing.install(autograd_cache, aot_autograd_result):
        return False
    return not autograd_cache.should_bundle_autograd_cache()


class _CachedCrossing:
    """The hooks. Making an entry for a flagos graph records on each side
    which outputs become flagos tensors and the ops it calls through flagos
    (_through_flagos: a fresh process defines them before the code that calls
    them loads), the device index and the routes of its ops. Loading a side
    so recorded takes the native device's example inputs, as it compiled, and
    wraps it in NativeCompiledGraph again. A side with flagos inputs and no
    record, a record of another format or flagos, or routes changed since,
    count as a miss."""

    installed = None

    @classmethod
    def install(cls, autograd_cache, results):
        if cls.installed is not None:
            return cls.installed
        cache = getattr(autograd_cache, "AOTAutogradCache", None)
        loadable = getattr(results, "FxGraphCacheLoadable", None)
        miss = getattr(autograd_cache, "FXGraphCacheMiss", None)
        cls.installed = (cache is not None and hasattr(cache, "make_entry") and miss is not None
                         and all(callable(getattr(loadable, name, None)) for name in ("load", "post_compile")))
        if cls.installed:
            cache.make_entry = staticmethod(cls.recording(cache.make_entry))
            loadable.load = cls.loading(loadable.load, miss)
            loadable.post_compile = cls.crossing_back(loadable.post_compile)
        return cls.installed

    @staticmethod
    def recording(make_entry):
        def make(*args, **kwargs):
            entry = make_entry(*args, **kwargs)
            graphs = (kwargs.get("compiled_fw_func", args[0] if args else None),
                      kwargs.get("compiled_bw_func", args[1] if len(args) > 1 else None))
            records = [getattr(graph, "_flagos_crossing", None) for graph in graphs]
            if records != [None, None]:  # a flagos graph's: both sides recorded, None for one left native
                from . import __version__

                for side, record in zip((entry.compiled_fw, entry.compiled_bw), records):
                    if side is not None:
                        side._flagos_crossing = dict(format=RECORD_FORMAT, version=__version__, crossing=record)
            return entry

        make.__wrapped__ = make_entry
        return make

    @staticmethod
    def loading(load, miss):
        def load_side(self, example_inputs):
            from . import __version__

            record = getattr(self, "_flagos_crossing", None)
            if record is None:  # a native graph's side (a flagos one always has a record)
                if any(_is_flagos(x) for x in example_inputs):
                    raise miss()
                return load(self, example_inputs)
            if record.get("format") != RECORD_FORMAT or record["version"] != __version__:
                raise miss()
            crossing = record["crossing"]
            if crossing is None:  # compiled without the crossing: loaded so too
                return load(self, example_inputs)
            # Which ops go through flagos was decided by the routes when it
            # compiled (set_route, confs): under other routes, compile anew.
            if any(route_of(name) != provider for name, provider in crossing["routes"].items()):
                raise miss()
            for namespace_name, overload, mask, numbers in crossing["through"]:
                namespace, name = namespace_name.split("::")
                _through_flagos(getattr(getattr(getattr(torch.ops, namespace), name), overload), tuple(mask),
                                tuple(numbers))
            return load(self, _on_native(example_inputs))

        load_side.__wrapped__ = load
        return load_side

    @staticmethod
    def crossing_back(post_compile):
        def post_compile_side(self, result, fx_config):
            result = post_compile(self, result, fx_config)
            # Reached only for a side that loaded: its record, if it has one, is current (load_side).
            crossing = getattr(self, "_flagos_crossing", {}).get("crossing")
            if crossing is None:
                return result
            return NativeCompiledGraph(result, crossing["positions"], crossing["index"], crossing["through"],
                                       crossing["routes"])

        post_compile_side.__wrapped__ = post_compile
        return post_compile_side
