// Counter-based randomness (Philox4x32-10, Salmon et al. 2011).
//
// Every random value in accumcheck is a pure function of (scenario seed,
// stream, a, b, c): no generator state, no call order.  The same sample id
// therefore gets the same inputs, targets and masks in every engine, for
// every K and every rank count.
#pragma once

#include <array>
#include <cstdint>

namespace accumcheck {

enum class Stream : uint32_t {
  input = 1,
  target = 2,
  init = 3,
  shuffle = 4,
  dropout = 5,
};

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr,
                                          std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * ctr[0];
    const uint64_t p1 = uint64_t{kM1} * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1),
           uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
    key = {key[0] + kW0, key[1] + kW1};
  }
  return ctr;
}

// 64 random bits for (seed, stream, a, b, c).
inline uint64_t random_bits(uint64_t seed, Stream stream, uint64_t a,
                            uint64_t b = 0, uint32_t c = 0) {
  const auto r = philox4x32(
      {uint32_t(a), uint32_t(a >> 32), uint32_t(b), uint32_t(b >> 32) ^ c},
      {uint32_t(seed) ^ (uint32_t(stream) << 24), uint32_t(seed >> 32) + c});
  return (uint64_t{r[0]} << 32) | r[1];
}

// A float32-exact value uniform in [-1, 1): m / 2^23 with |m| <= 2^23.
inline float uniform_pm1(uint64_t bits) {
  const int32_t m = int32_t(bits >> 40) - (1 << 23);  // 24 bits, centred
  return float(m) / float(1 << 23);
}

// A dyadic value n / 8 with n in [-8, 8]: products of a few of these and
// their sums stay exact in float32, the bitwise tier's inputs.
inline float dyadic_pm1(uint64_t bits) {
  const int32_t n = int32_t(bits % 17) - 8;
  return float(n) / 8.0f;
}

// Uniform integer in [0, n), n > 0 (bias < 2^-32 for the sizes used here).
inline uint64_t uniform_index(uint64_t bits, uint64_t n) {
  return uint64_t((static_cast<unsigned __int128>(bits) * n) >> 64);
}

// nn.Dropout's keep decision for one unit, keyed by (seed, epoch, sample
// id, layer, unit), never by call order: kept with probability 1 - p.
inline bool dropout_keep(uint64_t seed, int64_t epoch, int64_t sample,
                         int64_t layer, int64_t unit, double p) {
  const uint64_t bits =
      random_bits(seed, Stream::dropout, uint64_t(sample),
                  (uint64_t(epoch) << 16) | uint64_t(layer), uint32_t(unit));
  return double(bits >> 11) * 0x1p-53 >= p;
}

}  // namespace accumcheck
