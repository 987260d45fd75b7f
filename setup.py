"""The build: the modules every request passes through compiled to C with
mypyc (as black and mypy ship theirs), the rest plain Python.

``QS_PURE_PYTHON=1`` (or no C compiler, or no mypyc) builds plain Python
only: the same package, slower. The compiled modules are named in
:data:`COMPILED`; ``queueserver/__init__.py`` can also run a compiled
install as plain Python (``QS_PURE_PYTHON=1`` at run time), and does when a
source is not the one compiled: the build writes the record of its sources
(``queueserver/buildrecord.py``) beside the compiled modules, in a wheel
and in an editable (in-place) build alike.
"""
import importlib.util
import os
import shutil
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: The hot path: engine, codecs, client connections and links, the shard
#: and router shells, the store's writer (mypyc needs them type-correct:
#: mypy --strict checks them).
COMPILED = [
    "queueserver/engine/effects.py", "queueserver/engine/engine.py", "queueserver/engine/job.py",
    "queueserver/engine/jobqueue.py", "queueserver/engine/ownership.py", "queueserver/engine/status.py",
    "queueserver/engine/timers.py", "queueserver/engine/views.py", "queueserver/engine/requests.py",
    "queueserver/engine/ops.py", "queueserver/engine/observer.py",
    "queueserver/protocols/base.py", "queueserver/protocols/lines.py", "queueserver/protocols/ordering.py",
    "queueserver/protocols/workq.py", "queueserver/protocols/takeanumber.py",
    "queueserver/protocols/goqueue.py", "queueserver/protocols/queued.py", "queueserver/protocols/taskflux.py",
    "queueserver/net/connection.py", "queueserver/net/channel.py", "queueserver/net/hangups.py",
    "queueserver/net/tls.py", "queueserver/net/tlsrelay.py", "queueserver/net/tcpinfo.py",
    "queueserver/net/relayacks.py", "queueserver/net/tlsrecords.py", "queueserver/net/tlscontinued.py",
    "queueserver/net/tlskeylog.py",
    "queueserver/shard/shard.py", "queueserver/shard/direct.py", "queueserver/shard/durability.py",
    "queueserver/shard/stats.py", "queueserver/shard/outcomes.py", "queueserver/shard/idhome.py",
    "queueserver/shard/peers.py", "queueserver/shard/history.py", "queueserver/shard/hostids.py",
    "queueserver/shard/homes.py", "queueserver/shard/numbering.py",
    "queueserver/router/router.py", "queueserver/router/fanout.py", "queueserver/router/jobcache.py",
    "queueserver/router/clusterrouter.py",
    "queueserver/links/shardlink.py", "queueserver/links/directory.py", "queueserver/links/slotmap.py",
    "queueserver/store/writer.py", "queueserver/store/format.py",
    "queueserver/metrics/traffic.py", "queueserver/metrics/histogram.py", "queueserver/placement.py",
    "queueserver/metrics/uses.py",
]


def _load_buildrecord():
    """queueserver/buildrecord.py on its own: importing the package would
    run its __init__, which judges the build this is making."""
    spec = importlib.util.spec_from_file_location(
        "queueserver_buildrecord", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "queueserver", "buildrecord.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


buildrecord = _load_buildrecord()


#: setup.py commands that only describe the package: pip runs two of them
#: before the build, and compiling for them would triple an install's time.
METADATA_ONLY = ("egg_info", "dist_info", "sdist")


def compiled_modules():
    if os.environ.get("QS_PURE_PYTHON", "") not in ("", "0") or sys.argv[1:2] and sys.argv[1] in METADATA_ONLY:
        return []
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("queueserver: no C compiler: building plain Python (slower)", file=sys.stderr)
        return []
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        print("queueserver: no Python headers (Debian: apt-get install python3-dev): "
              "building plain Python (slower)", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("queueserver: no mypyc: building plain Python (slower)", file=sys.stderr)
        return []
    # multi_file: one C file per module, so a build compiles them in parallel
    try:
        return mypycify(["--config-file=setup.cfg", *COMPILED], opt_level="3", debug_level="0",
                        multi_file=True)
    except (Exception, SystemExit) as err:   # (mypyc exits when type checking fails, e.g. a newer mypy)
        print(f"queueserver: mypyc cannot compile the hot path ({err!r}): building plain Python "
              f"(slower)", file=sys.stderr)
        return []


class BuildOrFallBack(build_ext):
    """Compile the hot path, or, if that fails on this machine (a compiler
    that cannot build it), leave no part of it behind: the package then
    installs and runs as plain Python, and says why in the build's output."""

    #: the record of the compiled sources, taken when mypyc read them (see the end of this file)
    sources_record = ""

    def run(self):
        inplace = self.inplace
        try:
            super().run()
        except Exception as err:   # (distutils' CompileError, LinkError, ... and OSError)
            for self.inplace in (0, 1):   # in build/, and beside the sources
                for ext in self.extensions:
                    path = self.get_ext_fullpath(ext.name)
                    if os.path.exists(path):
                        os.unlink(path)
            self.inplace = inplace
            for path in self.record_paths():
                if os.path.exists(path):
                    os.unlink(path)
            print(f"queueserver: compiling the hot path failed ({err}): building plain Python "
                  f"(slower)", file=sys.stderr)
            return
        if self.extensions:
            for path in self.record_paths():
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(self.sources_record)

    def record_paths(self):
        """Where the record goes: beside the compiled modules in build/ (what a
        wheel holds), and beside the sources too when built in place (an
        editable install, as make does)."""
        paths = [os.path.join(self.build_lib, "queueserver", buildrecord.NAME)]
        if self.inplace:
            package = self.get_finalized_command("build_py").get_package_dir("queueserver")
            paths.append(os.path.join(package, buildrecord.NAME))
        return paths


# The record first: the sources as mypyc (compiled_modules) reads them, not
# as they may be when the C compile, minutes later, ends.
BuildOrFallBack.sources_record = buildrecord.text(COMPILED, os.path.dirname(os.path.abspath(__file__)))
setup(ext_modules=compiled_modules(), cmdclass={"build_ext": BuildOrFallBack})
