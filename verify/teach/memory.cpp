// `accumcheck memory` (verify/teach/memory.hpp): the allocation replay.
#include "verify/teach/memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "sim/errors.hpp"
#include "sim/layout.hpp"

namespace accumcheck {

namespace {

constexpr int64_t kF = 4;       // float32 bytes
constexpr int64_t kI64 = 8;     // int64 class targets
constexpr int64_t kScalar = 4;  // a 0-d float32 tensor
// `loss / K` with a Python int: K becomes a wrapped 0-d int64 tensor,
// which DivBackward0 saves (other) until it runs.
constexpr int64_t kWrappedInt = 8;
// A Python float operand of a float32 op: a wrapped 0-d double and its
// float32 copy (measured: 8 + 4 bytes for the op's duration).
constexpr int64_t kWrappedFloat = 8 + 4;

// Live bytes over one window, with the place of the maximum.
struct Replay {
  std::map<int, int64_t> blocks;  // id -> bytes
  int next = 0;
  int64_t live = 0, peak = 0;
  std::string peak_at, phase;
  int alloc(int64_t bytes) {
    blocks[next] = bytes;
    live += bytes;
    if (live > peak) peak = live, peak_at = phase;
    return next++;
  }
  void free(int id) {
    const auto it = blocks.find(id);
    if (it == blocks.end()) return;
    live -= it->second;
    blocks.erase(it);
  }
};

void check_supported(const Scenario& s) {
  if (s.model.kind != ModelKind::mlp)
    throw InputError(s.path, 0, 0, "model.kind",
                     "accumcheck memory covers MLP models (kind = \"mlp\"); "
                     "the token model's activations depend on its sequence "
                     "lengths and are not modelled yet");
  if (s.model.norm != NormKind::none)
    throw InputError(s.path, 0, 0, "model.norm",
                     "accumcheck memory covers MLPs without normalization "
                     "layers (their kernels' scratch is not modelled yet)");
  if (s.model.dropout > 0)
    throw InputError(s.path, 0, 0, "model.dropout",
                     "accumcheck memory covers MLPs without dropout");
}

}  // namespace

MemoryRow memory_row(const Scenario& s, int64_t b, int64_t K,
                     bool mixed_precision) {
  check_supported(s);
  const ParamLayout L = layout_of(s.model);
  const std::vector<int64_t>& w = s.model.widths;
  const int64_t P = L.total, C = w.back(), layers = int64_t(w.size()) - 1;
  const bool ce = s.model.loss == LossKind::cross_entropy;
  const Activation act = s.model.activation;
  const OptimizerSpec& o = s.optimizer;
  const bool adam = o.kind != OptimizerKind::sgd;
  const int64_t tensors = int64_t(L.tensors.size());

  MemoryRow r;
  r.b = b;
  r.K = K;
  r.params = P * kF;
  r.grads = P * kF;
  // Adam/AdamW: exp_avg, exp_avg_sq and a 0-d float32 `step` per tensor;
  // SGD: a momentum buffer (torch.clone of the first gradient) if any.
  r.states =
      adam ? 2 * P * kF + tensors * kScalar : (o.momentum != 0 ? P * kF : 0);
  if (mixed_precision) {
    // fp16/bf16 parameters and gradients, fp32 master weights.
    r.params = P * 2;
    r.grads = P * 2;
    r.master = P * kF;
  }
  const int64_t x_bytes = b * w.front() * kF;
  const int64_t y_bytes = ce ? b * kI64 : b * C * kF;
  r.data = x_bytes + y_bytes;

  // Steady state: parameters, gradients (zeroed in place by zero_grad,
  // set_to_none=False in 1.13) and optimizer states exist all window.
  Replay m;
  m.alloc(r.params + r.grads + r.states + r.master);
  const int64_t ebytes = mixed_precision ? 2 : kF;  // activation element
  for (int64_t k = 0; k < K; ++k) {
    m.phase = "forward";
    const int x = m.alloc(x_bytes), y = m.alloc(y_bytes);
    // Forward, as nn.Sequential runs it: each module's output replaces
    // its input, which is freed unless a backward node saved it.
    int cur = x;
    // Backward nodes in forward order; each releases, after it ran, the
    // saved tensors whose last holder it is.
    struct Node {
      enum Kind { addmm, act, loss } kind;
      int64_t in = 0, out = 0;  // the Linear's widths, or the act's width
      bool first = false;       // the first Linear: no grad for its input
      std::vector<int> release;
    };
    std::vector<Node> nodes;
    int cur_owner = -1;  // the node that releases `cur` (-1: Python does)
    for (int64_t l = 0; l < layers; ++l) {
      m.phase = fmt::format("forward {} (Linear)", l);
      // addmm(bias, input, weight.t()) saves its input (mat1) for
      // grad_weight.  An input that tanh/relu saved as their result is
      // released by that node, which runs after this one in backward.
      const int z = m.alloc(b * w[size_t(l) + 1] * ebytes);
      nodes.push_back(
          {Node::addmm, w[size_t(l)], w[size_t(l) + 1], l == 0, {}});
      if (cur != x)
        nodes[size_t(cur_owner >= 0 ? cur_owner : int(nodes.size()) - 1)]
            .release.push_back(cur);
      cur = z;
      cur_owner = -1;
      if (l + 1 == layers) break;
      if (act == Activation::identity) continue;
      m.phase = fmt::format("forward {} (activation)", l);
      const int a = m.alloc(b * w[size_t(l) + 1] * ebytes);
      nodes.push_back({Node::act, 0, w[size_t(l) + 1], false, {}});
      if (act == Activation::gelu) {
        nodes.back().release.push_back(z);  // gelu saves its input
        cur_owner = -1;
      } else {
        m.free(z);  // tanh and relu save their result instead
        cur_owner = int(nodes.size()) - 1;
      }
      cur = a;
    }
    // The loss: the output o stays referenced until the loss returns.
    m.phase = "forward (loss)";
    const int o_id = cur;
    int ls = -1, div_k = -1;
    if (ce) {
      ls = m.alloc(b * C * ebytes);  // log_softmax result, saved
      const int tw = m.alloc(kScalar), out = m.alloc(kScalar);
      m.free(o_id);  // the final Linear's output, not saved by anyone
      div_k = m.alloc(kWrappedInt);
      const int l2 = m.alloc(kScalar);  // loss / K
      m.free(out);
      nodes.push_back({Node::loss, 0, C, false, {tw, ls}});
      (void)l2;
    } else {
      // mse_loss: the element-wise loss into a temporary, then its mean.
      const int tmp = m.alloc(b * C * ebytes), out = m.alloc(kScalar);
      m.free(tmp);
      div_k = m.alloc(kWrappedInt);
      const int l2 = m.alloc(kScalar);  // loss / K
      m.free(out);
      nodes.push_back({Node::loss, 0, C, false, {o_id}});
      (void)l2;
    }
    const int64_t held_before_backward = m.live;
    if (k == 0)
      r.activations = held_before_backward -
                      (r.params + r.grads + r.states + r.master) - x_bytes -
                      y_bytes;

    // Backward: one node at a time, last first.  A node allocates its
    // outputs, then releases its saved tensors and its incoming gradient;
    // weight and bias gradients go into .grad in place (AccumulateGrad
    // runs next) and their temporaries are freed.
    m.phase = "backward (loss)";
    // The seed ones_like(loss) stays referenced until backward() returns.
    m.alloc(kScalar);
    int g = m.alloc(kScalar);  // DivBackward0: grad / K
    m.free(div_k);
    // (the loss scalars themselves die with the graph's last reference)
    for (size_t n = nodes.size(); n-- > 0;) {
      const Node& nd = nodes[n];
      int next = -1;
      if (nd.kind == Node::loss) {
        m.phase = "backward (loss)";
        if (ce) {
          // NllLossBackward: zeros_like(log_softmax), then
          // LogSoftmaxBackward: a new tensor (releases the result).
          const int g1 = m.alloc(b * C * ebytes);
          m.free(g);
          m.free(nd.release[0]);  // total_weight
          next = m.alloc(b * C * ebytes);
          m.free(nd.release[1]);
          m.free(g1);
          g = -1;
        } else {
          next = m.alloc(b * C * ebytes);  // mse_loss_backward
          for (int id : nd.release) m.free(id);
        }
      } else if (nd.kind == Node::act) {
        m.phase = "backward (activation)";
        next = m.alloc(b * nd.out * ebytes);
        for (int id : nd.release) m.free(id);
      } else {
        m.phase = "backward (Linear)";
        // grad_input = grad @ W (not for the first layer), grad_weight =
        // grad^T @ input (mm into a new tensor), grad_bias = sum_to(grad);
        // AccumulateGrad then adds them into .grad in place.
        next = nd.first ? -1 : m.alloc(b * nd.in * ebytes);
        const int gw = m.alloc(nd.in * nd.out * ebytes);
        const int gb = m.alloc(nd.out * ebytes);
        for (int id : nd.release) m.free(id);
        m.free(gw);
        m.free(gb);
      }
      if (g >= 0) m.free(g);
      g = next;
    }
    m.free(x);
    m.free(y);
    // the loss scalar (loss / K) and the mse/ce output are freed with `loss`
    m.live = r.params + r.grads + r.states + r.master;
    m.blocks.clear();
    m.blocks[-1] = m.live;
  }
  // The optimizer step, PyTorch 1.13's single-tensor loops on the CPU.
  int prev = -1;
  for (const TensorView& t : L.tensors) {
    m.phase = "optimizer step";
    const int64_t n = t.size() * (mixed_precision ? kF : kF);
    int wd = -1;
    if (o.weight_decay != 0 && o.kind != OptimizerKind::adamw)
      wd = m.alloc(n);  // grad = grad.add(param, alpha=wd)
    if (adam) {
      // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps):
      // sqrt, then the quotient; the previous tensor's denom is still
      // bound until the assignment.
      // (the Python float operand: kWrappedFloat for the op's duration).
      const int sq = m.alloc(n);
      const int bc = m.alloc(kWrappedFloat);
      const int dn = m.alloc(n);
      m.free(bc);
      m.free(sq);
      if (prev >= 0) m.free(prev);
      prev = dn;
    }
    if (wd >= 0) m.free(wd);
  }
  if (prev >= 0) m.free(prev);
  r.peak = m.peak;
  r.peak_at = m.peak_at;
  return r;
}

namespace {

std::string bytes_text(int64_t v) {
  if (v < 10 * 1024) return fmt::format("{} B", v);
  if (v < 10 * 1024 * 1024) return fmt::format("{:.1f} KiB", double(v) / 1024);
  return fmt::format("{:.1f} MiB", double(v) / (1024 * 1024));
}

std::string pct(int64_t part, int64_t whole) {
  return fmt::format("{:.1f} %",
                     whole > 0 ? 100.0 * double(part) / double(whole) : 0.0);
}

}  // namespace

std::string memory_text(const Scenario& s,
                        const std::vector<std::pair<int64_t, int64_t>>& bk,
                        bool mixed_precision) {
  std::vector<MemoryRow> rows;
  for (const auto& [b, K] : bk)
    rows.push_back(memory_row(s, b, K, mixed_precision));
  const ParamLayout L = layout_of(s.model);
  std::string o = fmt::format(
      "{}: {} parameters ({} tensors), {}{}\n"
      "PyTorch 1.13 CPU accounting (float32{}); steady-state window, bytes\n\n",
      s.name, L.total, L.tensors.size(),
      s.optimizer.kind == OptimizerKind::sgd
          ? (s.optimizer.momentum != 0 ? "SGD with momentum" : "plain SGD")
          : (s.optimizer.kind == OptimizerKind::adam ? "Adam" : "AdamW"),
      s.optimizer.weight_decay != 0 ? " with weight decay" : "",
      mixed_precision ? "; mixed precision: 2-byte parameters, gradients and "
                        "activations, 4-byte master weights"
                      : "");
  o += fmt::format(
      "{:>5} {:>4} {:>6} | {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} | {:>11}  "
      "{}\n",
      "b", "K", "b*K", "parameters", "gradients", "optimizer", "master",
      "batch", "activations", "peak", "peak during");
  for (const MemoryRow& r : rows)
    o += fmt::format(
        "{:>5} {:>4} {:>6} | {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} | "
        "{:>11}  {}\n",
        r.b, r.K, r.b * r.K, bytes_text(r.params), bytes_text(r.grads),
        bytes_text(r.states), bytes_text(r.master), bytes_text(r.data),
        bytes_text(r.activations), bytes_text(r.peak), r.peak_at);

  if (s.model.activation == Activation::gelu)
    o += "note: Debian's PyTorch 1.13 CPU GELU takes shape-dependent scratch "
         "memory (measured 3.5 to 13.6 KB for b x 12 inputs) that this "
         "replay does not model: for GELU models the peak is a lower bound\n";
  if (s.clip.enabled || s.optimizer.l2_in_loss != 0)
    o += "note: clip_grad_norm_'s per-tensor norms and an L2 term in the "
         "loss are not in the replay (the loop measured has neither)\n";

  // The seeds' claims, at the scenario's effective batch B = b*K.
  const int64_t B = s.batching.micro_batch * s.batching.accumulation;
  const int64_t K = s.batching.accumulation;
  const MemoryRow big = memory_row(s, B, 1, mixed_precision);
  const MemoryRow acc =
      memory_row(s, s.batching.micro_batch, K, mixed_precision);
  o += fmt::format(
      "\nThe seeds' claims, at the scenario's batch {} = {} x {} (K = 1 "
      "against K = {}):\n",
      B, s.batching.micro_batch, K, K);
  o += fmt::format(
      "- seed 002, \"gradient storage falls to 0 % with accumulation\": "
      "WRONG. Gradients take {} ({} of the peak) at K = 1 and {} ({} of "
      "the peak) at K = {}: .grad must live across the whole window to "
      "accumulate into.\n",
      bytes_text(big.grads), pct(big.grads, big.peak), bytes_text(acc.grads),
      pct(acc.grads, acc.peak), K);
  // Seed 004 counts parameters, so compare float32 bytes.
  const MemoryRow f32 = memory_row(s, s.batching.micro_batch, K, false);
  o += fmt::format(
      "- seed 004, \"Adam costs parameters x 3\": {}. Parameters + "
      "optimizer states = {:.3f} x the parameters; with the gradients "
      "training holds {:.3f} x before any activation{}.\n",
      s.optimizer.kind == OptimizerKind::sgd
          ? "not testable on this scenario's SGD (run scenarios/"
            "memory-lesson.toml)"
          : "RIGHT for parameters + states, short of the bill",
      double(f32.params + f32.states) / double(f32.params),
      double(f32.params + f32.grads + f32.states) / double(f32.params),
      mixed_precision
          ? fmt::format(
                "; mixed precision: {} bytes per parameter "
                "(2-byte parameters and gradients, 4-byte "
                "master weights, the states) against {} "
                "in float32",
                (acc.params + acc.grads + acc.states + acc.master) / L.total,
                (f32.params + f32.grads + f32.states) / L.total)
          : std::string());
  const bool only_acts = big.params == acc.params && big.grads == acc.grads &&
                         big.states == acc.states &&
                         acc.activations < big.activations;
  o += fmt::format(
      "- seed 000, \"accumulation saves only activation memory\": {}. "
      "Parameters, gradients and optimizer states are equal at K = 1 and K "
      "= {}; activations fall from {} to {} ({:.2f}x, b = {} instead of "
      "{}), the peak from {} to {}.\n",
      only_acts ? "RIGHT" : "WRONG here", K, bytes_text(big.activations),
      bytes_text(acc.activations),
      double(big.activations) / double(std::max<int64_t>(1, acc.activations)),
      s.batching.micro_batch, B, bytes_text(big.peak), bytes_text(acc.peak));
  return o;
}

std::string memory_row_kv(const MemoryRow& r) {
  return fmt::format(
      "b {}\nK {}\nparams {}\ngrads {}\nstates {}\nmaster {}\ndata {}\n"
      "activations {}\npeak {}\n",
      r.b, r.K, r.params, r.grads, r.states, r.master, r.data, r.activations,
      r.peak);
}

}  // namespace accumcheck
