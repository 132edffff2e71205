#!/usr/bin/env python3
"""Self-test of check_layering.py: a forbidden edge in a scratch tree must be reported."""
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import check_layering  # noqa: E402


def write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def main():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        write(root, "proto/a.hpp", '#include "proto/b.hpp"\n')
        write(root, "driver/ok.cpp", '#include "workers/api/x.hpp"\n#include "workers/tokenizer/tokenizer.hpp"\n')
        files, problems = check_layering.check(root)
        assert files == 2 and problems == [], problems
        write(root, "driver/bad.cpp", '#include "workers/fsdp/flat.hpp"\n')
        write(root, "proto/up.hpp", '#include "runtime/actor.hpp"\n')
        write(root, "runtime/gen.cpp", '#include "proto/wire.capnp.h"\n')
        write(root, "workers/models/m.hpp", '#include <torch/torch.h>\n')
        write(root, "workers/rollout/r.cpp", '#include "workers/fsdp/internal/x.hpp"\n')
        write(root, "workers/tokenizer/t.cpp", '#include "workers/tokenizer/jinja/internal/value.hpp"\n')
        files, problems = check_layering.check(root)
        text = "\n".join(problems)
        for needle in ["driver -> fsdp", "proto -> runtime", "runtime includes generated",
                       "header includes <torch/torch.h>", "private header",
                       "tokenizer includes jinja's private header"]:
            assert needle in text, f"missing '{needle}' in:\n{text}"
    print("check_layering self-test: 6 violations detected, clean tree passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
