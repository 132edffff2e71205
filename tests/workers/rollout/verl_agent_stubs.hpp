// verl_agent_stubs.hpp: what the agent-loop tests put on the Python path of verl's agent loops.
#pragma once

namespace tessera::rollout::testing {

/// A sitecustomize.py of test-only stand-ins: verl's agent-loop module imports Ray, FastAPI and
/// uvicorn (for its servers, which Tessera does not start), and verl 0.5's loops expect
/// transformers 4's apply_chat_template (a list of ids, where transformers 5 returns a
/// BatchEncoding).
inline constexpr const char* kVerlAgentStubs = R"PY(
import importlib.abc, importlib.machinery, sys, types
from unittest import mock
STUBBED = {"ray", "fastapi", "uvicorn", "starlette", "openai", "aiohttp"}
def _remote(*a, **k):
    return a[0] if len(a) == 1 and callable(a[0]) and not k else (lambda c: c)
class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in STUBBED else None
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
        if spec.name == "ray":
            m.remote, m.ObjectRef = _remote, object
        return m
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Stubs())
import transformers
_apply = transformers.PreTrainedTokenizerBase.apply_chat_template
def _apply_v4(self, *args, **kwargs):
    if kwargs.get("tokenize", True):
        kwargs.setdefault("return_dict", False)
    return _apply(self, *args, **kwargs)
transformers.PreTrainedTokenizerBase.apply_chat_template = _apply_v4
)PY";

}  // namespace tessera::rollout::testing
