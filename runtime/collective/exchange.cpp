// exchange.cpp: all_to_all_v and all_gather_bytes (Note [Pairwise exchange schedule]).
#include "runtime/collective/exchange.hpp"

#include <torch/torch.h>

namespace tessera::collective {

Status all_to_all_v(Communicator& comm, const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                    const CollectiveOptions& opts) {
  const int n = comm.size(), me = comm.rank();
  if (static_cast<int>(send.size()) != n || static_cast<int>(recv.size()) != n) {
    return make_error(ErrorCode::invalid_argument, "all_to_all_v (rank {} of {}, group {}): {} send and {} recv entries",
                      me, n, comm.group_name(), send.size(), recv.size());
  }
  if (send[me].numel() != recv[me].numel()) {
    return make_error(ErrorCode::invalid_argument, "all_to_all_v (rank {} of {}, group {}): self entry {} != {} elements",
                      me, n, comm.group_name(), send[me].numel(), recv[me].numel());
  }
  try {
    if (send[me].numel() > 0) recv[me].view(-1).copy_(send[me].view(-1));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::invalid_argument, "all_to_all_v self copy (rank {}): {}", me, e.what());
  }
  return comm.do_all_to_all_v(send, recv, opts.timeout.count() > 0 ? opts.timeout : comm.default_timeout());
}

Status Communicator::do_all_to_all_v(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                                     std::chrono::milliseconds timeout) {
  const int n = size(), me = rank();
  CollectiveOptions opts;
  opts.timeout = timeout;
  auto send_to = [&](int peer) { return send[peer].numel() > 0 ? this->send(send[peer], peer, opts) : Status(); };
  auto recv_from = [&](int peer) { return recv[peer].numel() > 0 ? this->recv(recv[peer], peer, opts) : Status(); };
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (me == i) {
        TESSERA_RETURN_IF_ERROR(send_to(j));
        TESSERA_RETURN_IF_ERROR(recv_from(j));
      } else if (me == j) {
        TESSERA_RETURN_IF_ERROR(recv_from(i));
        TESSERA_RETURN_IF_ERROR(send_to(i));
      }
    }
  }
  return Status();
}

Result<std::vector<at::Tensor>> all_gather_bytes(Communicator& comm, const at::Tensor& bytes,
                                                 const CollectiveOptions& opts) {
  const int n = comm.size();
  at::Tensor length = at::full({1}, bytes.numel(), at::kLong);
  at::Tensor lengths = at::empty({n}, at::kLong);
  TESSERA_RETURN_IF_ERROR(comm.all_gather(length, lengths, opts));
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor padded = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  if (bytes.numel() > 0) padded.narrow(0, 0, bytes.numel()).copy_(bytes.reshape(-1));
  at::Tensor all = at::empty({n * padded.numel()}, at::kByte);
  TESSERA_RETURN_IF_ERROR(comm.all_gather(padded, all, opts));
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) out.push_back(all.narrow(0, r * padded.numel(), lengths[r].item<int64_t>()));
  return out;
}

}  // namespace tessera::collective
