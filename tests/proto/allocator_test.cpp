// The process allocator (Note [Allocator] in the top CMakeLists.txt): with TESSERA_MALLOC=jemalloc
// every executable's malloc, LibTorch's CPU tensors included, is jemalloc's. ctest passes the
// configured allocator in TESSERA_MALLOC; jemalloc is reached through dlsym, so the test needs
// no jemalloc header (and no flag that would set it apart from the shared precompiled header).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <sys/types.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

namespace {

using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);

std::string configured() {
  const char* v = std::getenv("TESSERA_MALLOC");
  return v == nullptr ? std::string() : std::string(v);
}

std::string library_of(const char* symbol) {
  void* fn = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// jemalloc's mallctl (null when jemalloc is not the process allocator).
Mallctl jemalloc_mallctl() { return reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl")); }

// Bytes jemalloc has handed out and not taken back (its statistics, refreshed first).
size_t jemalloc_allocated(Mallctl mallctl) {
  uint64_t epoch = 1;
  size_t len = sizeof(epoch);
  EXPECT_EQ(mallctl("epoch", &epoch, &len, &epoch, len), 0);
  size_t allocated = 0;
  len = sizeof(allocated);
  EXPECT_EQ(mallctl("stats.allocated", &allocated, &len, nullptr, 0), 0);
  return allocated;
}

TEST(Allocator, MallocIsTheConfiguredOne) {
  if (configured().empty()) GTEST_SKIP() << "TESSERA_MALLOC not set (run outside ctest)";
  std::string lib = library_of("malloc");
  const char* expected = configured() == "jemalloc" ? "jemalloc" : "libc.so";
  EXPECT_NE(lib.find(expected), std::string::npos) << "malloc comes from " << lib;
}

// cmake/jemalloc_conf.cpp's options are in effect (unless MALLOC_CONF overrides them).
TEST(Allocator, JemallocUsesTheBuildsPurgeDelay) {
  if (configured() != "jemalloc") GTEST_SKIP() << "not a jemalloc build";
  if (std::getenv("MALLOC_CONF") != nullptr) GTEST_SKIP() << "MALLOC_CONF overrides the options";
  Mallctl mallctl = jemalloc_mallctl();
  ASSERT_NE(mallctl, nullptr);
  for (const char* opt : {"opt.dirty_decay_ms", "opt.muzzy_decay_ms"}) {
    ssize_t ms = 0;
    size_t len = sizeof(ms);
    ASSERT_EQ(mallctl(opt, &ms, &len, nullptr, 0), 0) << opt;
    EXPECT_EQ(ms, 60000) << opt;
  }
}

TEST(Allocator, LibTorchTensorsComeFromJemalloc) {
  if (configured() != "jemalloc") GTEST_SKIP() << "not a jemalloc build";
  Mallctl mallctl = jemalloc_mallctl();
  ASSERT_NE(mallctl, nullptr);
  constexpr size_t kBytes = size_t{64} << 20;
  size_t before = jemalloc_allocated(mallctl);
  {
    at::Tensor t = torch::empty({static_cast<int64_t>(kBytes / sizeof(float))}, torch::kFloat32);
    EXPECT_GE(jemalloc_allocated(mallctl), before + kBytes);
  }
  EXPECT_LT(jemalloc_allocated(mallctl), before + kBytes);  // and freed through it
}

}  // namespace
