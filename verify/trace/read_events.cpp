// Trace reading: events.csv (verify/trace/read_csv.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "verify/trace/columns.hpp"
#include "verify/trace/read_csv.hpp"

namespace accumcheck::trace_detail {

void read_events(Trace& t, RunTracker& runs) {
  const bool v1 = t.meta_value("schema") == kTraceSchemaV1;
  const std::string_view header = v1 ? kEventsHeaderV1 : kEventsHeader;
  CsvFile f(t.events_path(), header);
  Reader<12> r(f.bytes);
  f.read_header_flags(r, io::ignore_missing_column, header, "run", "epoch",
                      "step", "micro", "event", "samples", "tokens", "loss",
                      "lr", "grad_norm", "sample_ids", "rank");
  for (std::string_view c : {"run", "epoch", "step", "micro", "event",
                             "samples", "tokens", "loss", "lr", "grad_norm"})
    if (!r.has_column(std::string(c)))
      f.fail(1, c,
             fmt::format("missing column '{}'; expected the header {}", c,
                         header));
  if (v1 && r.has_column("sample_ids"))
    f.fail(1, "sample_ids",
           fmt::format("column 'sample_ids' in a {} trace; expected the "
                       "header {}",
                       kTraceSchemaV1, header));
  if (!v1 && !r.has_column("sample_ids"))
    f.fail(1, "sample_ids",
           fmt::format("missing column 'sample_ids'; expected the header {}",
                       header));
  std::string run, event;
  char *epoch = nullptr, *step = nullptr, *micro = nullptr, *samples = nullptr,
       *tokens = nullptr, *loss = nullptr, *lr = nullptr, *norm = nullptr;
  char* ids = nullptr;
  char zero[] = "0";
  char* rank = zero;
  int64_t line = 0;
  while (f.row(r, line, run, epoch, step, micro, event, samples, tokens, loss,
               lr, norm, ids, rank)) {
    TraceRun& tr = runs.at(f, line, run);
    TraceEvent te;
    te.line = line;
    Event& e = te.event;
    e.epoch = f.integer(line, "epoch", epoch, 0);
    e.step = f.integer(line, "step", step, 0);
    e.micro = f.integer(line, "micro", micro, -1);
    const auto* kind =
        std::find_if(std::begin(kEventKinds), std::end(kEventKinds),
                     [&](EventKind k) { return event_name(k) == event; });
    if (kind == std::end(kEventKinds))
      f.fail(line, "event",
             fmt::format("unknown event '{}'; expected zero_grad, "
                         "forward_backward, clip, optimizer_step, "
                         "scheduler_step, all_reduce, unscale, "
                         "scaler_update or ema_update",
                         event));
    e.kind = *kind;
    e.samples = f.integer(line, "samples", samples, 0);
    e.tokens = f.integer(line, "tokens", tokens, 0);
    e.loss = f.real(line, "loss", loss);
    e.lr = f.real(line, "lr", lr);
    e.grad_norm = f.real(line, "grad_norm", norm);
    e.rank = f.integer(line, "rank", rank, -1);
    if (ids != nullptr && *ids != '\0') {
      std::string_view rest(ids);
      while (!rest.empty()) {
        const size_t sp = rest.find(' ');
        const std::string_view tok = rest.substr(0, sp);
        e.sample_ids.push_back(f.integer(line, "sample_ids", tok, 0));
        rest = sp == std::string_view::npos ? std::string_view()
                                            : rest.substr(sp + 1);
      }
      if (e.kind != EventKind::forward_backward)
        f.fail(line, "sample_ids",
               fmt::format("sample ids on a {} event; only forward_backward "
                           "events carry them",
                           event));
    }
    if (!tr.events.empty()) {
      const Event& prev = tr.events.back().event;
      if (e.epoch < prev.epoch)
        f.fail(line, "epoch",
               fmt::format("epochs out of order in run '{}': {} after {} "
                           "(line {})",
                           run, e.epoch, prev.epoch, tr.events.back().line));
      if (e.step < prev.step)
        f.fail(line, "step",
               fmt::format("steps out of order in run '{}': {} after {} "
                           "(line {})",
                           run, e.step, prev.step, tr.events.back().line));
    }
    tr.events.push_back(te);
  }
}

}  // namespace accumcheck::trace_detail
