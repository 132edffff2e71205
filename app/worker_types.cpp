#include "app/worker_types.hpp"

#include <cstdio>
#include <cstdlib>

#include "workers/roles/registry.hpp"
#include "workers/roles/sft_worker.hpp"

namespace tessera::app {

const runtime::WorkerTypeRegistry& worker_types() {
  static const runtime::WorkerTypeRegistry registry = [] {
    runtime::WorkerTypeRegistry r;
    Status st = workers::register_worker_types(r);
    if (st.ok()) st = workers::register_sft_worker(r);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera: registering worker types: %s\n", st.to_string().c_str());
      std::abort();
    }
    return r;
  }();
  return registry;
}

}  // namespace tessera::app
