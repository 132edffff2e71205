// element.hpp: the element types Tessera's CUDA kernels take, as a plain enum that their host
// interfaces (raw pointers and a stream, no LibTorch) share; element.cuh converts on the device.
#pragma once

#include <cstdint>

namespace tessera::proto::cuda {

/// The floating element types the kernels are instantiated for.
enum class ElementType : uint8_t { f32, f16, bf16 };

}  // namespace tessera::proto::cuda
