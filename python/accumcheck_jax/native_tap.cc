// accumcheck_jax's tap on jax's CPU backend: an XLA FFI handler that
// copies its operands (the outputs of the forward rec.apply wrapped and
// the cotangent your loss sent into them) into a queue of the recorder's,
// in whatever thread XLA runs your program on, and writes the zero the
// tap adds to your gradient's bits.
//
// Why not a host callback (jax.pure_callback): jax runs a CPU program that
// holds a Python callback synchronously in the thread that dispatches it,
// while your other programs run on its worker threads.  That alone, with
// no recorder, raised a decoder's peak memory by 16-19% (glibc keeps the
// freed buffers of both threads' heaps); an FFI call is no Python callback,
// so your program keeps jax's asynchronous dispatch (docs/frameworks-jax-
// keras.md, "Cost").
//
// The recorder (native.py) builds this file against jaxlib's own FFI
// headers (jax.ffi.include_dir()) the first time it is needed, loads it
// with ctypes and takes the blocks out after the programs that made them
// have run.  Nothing here calls Python or takes its lock.
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Block {
  int64_t site;             // which traced backward (its operands' layout)
  std::vector<char> bytes;  // its operands, one after another
};

struct Channel {
  bool open = true;          // muted: the handler writes the zero alone
  std::deque<Block> blocks;  // in the order the programs ran
};

std::mutex mu;
std::unordered_map<int64_t, Channel> channels;

ffi::Error Tap(int64_t channel, int64_t site, ffi::RemainingArgs args,
               ffi::Result<ffi::AnyBuffer> zero) {
  std::memset(zero->untyped_data(), 0, zero->size_bytes());
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = channels.find(channel);
    if (it == channels.end() || !it->second.open) return ffi::Error::Success();
  }
  size_t total = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error())
      return ffi::Error::Success();  // no block: one tap short
    total += buffer.value().size_bytes();
  }
  Block block{site, std::vector<char>(total)};
  size_t at = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i).value();
    if (buffer.size_bytes() > 0) {
      std::memcpy(block.bytes.data() + at, buffer.untyped_data(),
                  buffer.size_bytes());
    }
    at += buffer.size_bytes();
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = channels.find(channel);
  if (it != channels.end() && it->second.open)
    it->second.blocks.push_back(std::move(block));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AccumcheckTap, Tap,
                              ffi::Ffi::Bind()
                                  .Attr<int64_t>("channel")
                                  .Attr<int64_t>("site")
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>());

extern "C" {

// A recorder's channel: its taps are queued from now on.
void accumcheck_tap_open(int64_t channel) {
  std::lock_guard<std::mutex> lock(mu);
  channels[channel] = Channel{};
}

// Its taps dropped from now on (the handler writes the zero alone), and
// what is queued freed.
void accumcheck_tap_mute(int64_t channel) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = channels.find(channel);
  if (it == channels.end()) return;
  it->second.open = false;
  it->second.blocks.clear();
}

// The channel forgotten (the recorder closed).
void accumcheck_tap_close(int64_t channel) {
  std::lock_guard<std::mutex> lock(mu);
  channels.erase(channel);
}

// The bytes queued.
int64_t accumcheck_tap_bytes(int64_t channel) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = channels.find(channel);
  if (it == channels.end()) return 0;
  int64_t n = 0;
  for (const Block& block : it->second.blocks)
    n += static_cast<int64_t>(block.bytes.size());
  return n;
}

// The oldest queued block's size in bytes (its site in *site), or -1.
int64_t accumcheck_tap_front(int64_t channel, int64_t* site) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = channels.find(channel);
  if (it == channels.end() || it->second.blocks.empty()) return -1;
  *site = it->second.blocks.front().site;
  return static_cast<int64_t>(it->second.blocks.front().bytes.size());
}

// The oldest block copied into dst (size bytes, as front said) and freed:
// 0, or -1 where there is none of that size.
int accumcheck_tap_pop(int64_t channel, void* dst, int64_t size) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = channels.find(channel);
  if (it == channels.end() || it->second.blocks.empty()) return -1;
  Block& front = it->second.blocks.front();
  if (static_cast<int64_t>(front.bytes.size()) != size) return -1;
  if (size > 0) std::memcpy(dst, front.bytes.data(), front.bytes.size());
  it->second.blocks.pop_front();
  return 0;
}

}  // extern "C"
