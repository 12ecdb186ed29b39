// `accumcheck memory`: the training-memory breakdown of a scenario's model
// by micro-batch size and K (verify/teach/memory.hpp).
#include <cstdio>

#include "cli/commands.hpp"
#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/teach/memory.hpp"

namespace accumcheck::cli {

int memory_command(const MemoryOptions& o) {
  const Scenario s = parse_scenario_file(o.scenario);
  std::vector<std::pair<int64_t, int64_t>> bk;
  if (o.b.empty() && o.k.empty()) {
    // The scenario's batch B = b*K, split as b = B/K' for K' = 1, 2, 4, ...
    const int64_t B = s.batching.micro_batch * s.batching.accumulation;
    for (int64_t K = 1; K <= B && K <= 64; K *= 2)
      if (B % K == 0) bk.emplace_back(B / K, K);
  } else {
    const std::vector<long long> bs =
        o.b.empty() ? std::vector<long long>{s.batching.micro_batch} : o.b;
    const std::vector<long long> ks =
        o.k.empty() ? std::vector<long long>{s.batching.accumulation} : o.k;
    for (long long b : bs)
      for (long long k : ks) bk.emplace_back(b, k);
  }
  if (o.kv) {
    if (bk.size() != 1)
      throw InputError("", 0, 0, "--kv", "needs exactly one --b and one --k");
    std::printf("%s", memory_row_kv(memory_row(s, bk[0].first, bk[0].second,
                                               o.mixed_precision))
                          .c_str());
    return 0;
  }
  std::printf("%s", memory_text(s, bk, o.mixed_precision).c_str());
  return 0;
}

}  // namespace accumcheck::cli
