// store.cpp: TCPStore rendezvous helpers (see internal/store.hpp).
#include "runtime/collective/internal/store.hpp"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "runtime/collective/internal/backends.hpp"

namespace tessera::collective::internal {

bool mentions_timeout(const std::string& msg) {
  for (const char* word : {"timed out", "Timed out", "Timeout", "timeout"}) {
    if (msg.find(word) != std::string::npos) return true;
  }
  return false;
}

Result<c10::intrusive_ptr<c10d::Store>> connect_tcp_store(const CommunicatorOptions& o) {
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.waitWorkers = false;  // wait_for_joins names absent ranks; TCPStore's own wait would not
    // TCPStore's connect is not meant for sub-second deadlines (it can fail against a live
    // server): it gets at least 5 s, and the join wait below applies the real timeout.
    so.timeout = std::max(o.timeout, std::chrono::milliseconds(5000));
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(o.master_addr, so));
  } catch (const std::exception& e) {
    std::string msg = first_line(e);
    return Status(mentions_timeout(msg) ? ErrorCode::timeout : ErrorCode::unavailable,
                  fmt::format("TCPStore {}:{}: {}", o.master_addr, o.master_port, msg));
  }
}

Status wait_for_joins(c10d::Store& store, const std::string& prefix, int rank, int size,
                      std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/join/{}", prefix, r));
  try {
    store.set(keys[rank], std::vector<uint8_t>{1});
    store.wait(keys, timeout);
    return Status();
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < size; ++r) {
        if (!store.check({keys[r]})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      missing.clear();  // the store itself is gone; report the original failure
    }
    if (missing.empty()) {
      return make_error(ErrorCode::unavailable, "store wait failed: {}", first_line(e));
    }
    return make_error(ErrorCode::timeout, "{} did not join within {} ms", describe_peers(missing),
                      timeout.count());
  }
}

}  // namespace tessera::collective::internal
