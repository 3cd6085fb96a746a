// tools/stitch_replay.cpp — the stitch-replay command: replays recorded allocation traces
// (PyTorch snapshot pickles, stitch snapshots, RMM CSV logs) through stitch on the simulated
// device under several configurations and reports what each would have reserved.
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "tools/common/arg_reader.hpp"
#include "tools/stitch_replay/breakdown.hpp"
#include "tools/stitch_replay/explanations.hpp"
#include "tools/stitch_replay/html_report.hpp"
#include "tools/stitch_replay/report.hpp"
#include "tools/stitch_replay/trace_file.hpp"

namespace {

constexpr const char* kUsage = R"(usage: stitch-replay [options] TRACE...

Replays each TRACE (a PyTorch memory snapshot pickle from torch.cuda.memory._dump_snapshot, a
stitch snapshot, or an RMM logging_resource_adaptor CSV) through stitch on a simulated device and
prints, per trace, device and configuration: peak requested and reserved bytes, reserved /
requested, peak of reserved-but-unallocated, the largest free block at that worst moment, device
calls, OOMs and replay speed. Every replay counts the memory the program held before the trace
began (the blocks live at the start are allocated first).

Per trace it also reports the start (what was live and what the recording allocator held),
the recording's true peak reserved, and a fidelity replay: the trace replayed under the
settings the recording ran with (its allocator_settings), from the recorded start, giving back
cached memory where the recording did, compared with that peak (docs/fragmentation.md).

options:
  --config CONF     a configuration in STITCH_ALLOC_CONF syntax; repeat to compare several
                    (default: PyTorch's defaults "" and "expandable_segments:True")
  --capacity SIZE   simulated device size, e.g. 80GiB (default 1TiB: nothing runs out); the
                    first OOM of each config is explained: the request and its stream, the
                    verdict with its numbers, the run's other configs on the same device, the
                    largest live blocks and the recorded frames of the request
  --explain-all     explain every OOM, not only the first
  --min-capacity    also find, by bisection, the smallest device on which each config completes
                    the trace without an OOM
  --fits            replay each config on the memory of common GPUs (their reported total less
                    a 512 MiB CUDA context: 14.06, 21.55, 39.09, 43.92, 78.61 and 139.30 GiB;
                    docs/fragmentation.md names them) and say, per size, whether it fits (runs
                    without an OOM), the headroom at the peak, or the first OOM's verdict; the
                    smallest fitting device is found too, sharing those replays
  --fits=SIZES      the same on the sizes given, e.g. --fits=24GiB,40GiB (the '=' is needed)
  --device N        replay only device N
  --json            print JSON instead of tables
  --breakdown       also print, per config, where reserved minus requested lies when reserved
                    peaks (rounding, pending frees, plain segments, partly used pages, whole free
                    pages by pool and stream); one more replay to the peak each
  --html FILE       write one self-contained HTML page (no network, no server): per trace and
                    device the configs' table, their requested/reserved/unallocated plot on one
                    event axis, the breakdown at the peak, the fits table and the OOM
                    explanations
  --plot FILE.svg   write requested/reserved/unallocated over the trace (one file per trace and
                    device: FILE-<n>.svg when there are several)
  --costs FILE      the per-call costs of the estimated device time (a JSON object of call
                    name: µs per call, or {"per_call_us": x, "per_mib_us": y}; the GPU check
                    writes one); default: published figures (docs/fragmentation.md)
  --no-progress     no progress bar, even on a terminal
  -h, --help        this text
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace stitch::replay_cli;
  std::vector<std::string> configs, traces;
  std::size_t capacity = std::size_t{1} << 40;
  bool search = false, json = false, breakdown = false, progress = isatty(STDERR_FILENO) != 0;
  bool explain_all = false;
  std::vector<std::size_t> fit_sizes;
  int only_device = -1;
  std::string plot, html;
  CostModel costs = CostModel::published();
  try {
    for (stitch::tools::ArgReader args(argc, argv); args.next();) {
      const std::string& a = args.current();
      auto value = [&] { return args.value(); };
      if (a == "-h" || a == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--config") {
        configs.push_back(value());
      } else if (a == "--capacity") {
        capacity = parse_size(value());
      } else if (a == "--fits") {
        fit_sizes = common_gpu_sizes();
      } else if (a.starts_with("--fits=")) {
        fit_sizes = parse_size_list(a.substr(7));
      } else if (a == "--explain-all") {
        explain_all = true;
      } else if (a == "--min-capacity") {
        search = true;
      } else if (a == "--device") {
        only_device = std::stoi(value());
      } else if (a == "--breakdown") {
        breakdown = true;
      } else if (a == "--json") {
        json = true;
      } else if (a == "--html") {
        html = value();
      } else if (a == "--plot") {
        plot = value();
      } else if (a == "--costs") {
        costs = CostModel::from_file(value());
      } else if (a == "--no-progress") {
        progress = false;
      } else if (!a.empty() && a[0] == '-') {
        throw stitch::error("unknown option " + a + " (see --help)");
      } else {
        traces.push_back(a);
      }
    }
    if (traces.empty()) throw stitch::error("no trace given (see --help)");
    if (configs.empty()) configs = {"", "expandable_segments:True"};
    for (const std::string& c : configs)  // fail early on a bad configuration
      (void)stitch::Config::parse(c.empty() ? "backend:sim" : "backend:sim," + c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stitch-replay: %s\n", e.what());
    return 2;
  }

  int status = 0;
  std::vector<TraceReport> reports;
  int plot_index = 0;
  for (const std::string& path : traces) {
    TraceFile w;
    try {
      w = read_trace_file(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "stitch-replay: error: %s\n", e.what());
      status = 1;
      continue;
    }
    if (w.devices.empty()) std::fprintf(stderr, "stitch-replay: %s: no allocation events\n", path.c_str());
    for (const DeviceWorkload& t : w.devices) {
      if (only_device >= 0 && t.device != only_device) continue;
      TraceReport report = trace_report(path, w, t);
      report.costs = costs;
      report.explain_all = explain_all;
      try {
        report.fidelity = fidelity(t, w.recorded);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "stitch-replay: error: %s: fidelity replay: %s\n", path.c_str(), e.what());
        status = 1;
      }
      for (const std::string& c : configs) {
        ReplayOptions o;
        o.config = c;
        o.capacity = capacity;
        o.explain = explain_all ? Explain::all : Explain::first;
        o.sample_every = plot.empty() && html.empty() ? 0 : std::max<std::size_t>(1, t.events.size() / 2000);
        if (progress) {
          o.progress = [&](std::size_t done, std::size_t total) {
            std::fprintf(stderr, "\r%s [%s]: %zu/%zu events", path.c_str(),
                         c.empty() ? "defaults" : c.c_str(), done, total);
            if (done == total) std::fputs("\n", stderr);
          };
        }
        Row row;
        try {
          row.result = replay(t, o);
          CapacityProbe probe(t, c);
          if (!fit_sizes.empty()) {
            for (std::size_t size : fit_sizes) (void)probe.at(size);  // they bound the bisection
            row.min_capacity_searched = true;
            row.min_capacity = probe.min_capacity(capacity, std::size_t{2} << 20, row.result.peak_reserved);
            row.fits = probe.fits(fit_sizes, row.min_capacity);
            for (const CapacityOutcome& f : row.fits)
              if (!f.note.empty())
                row.min_capacity_note = fmt::format("{} {} on {}", row.min_capacity_note.empty() ? "but" : ";",
                                                    f.fits ? "it fits" : "it runs out", human_size(f.capacity));
          } else if (search) {
            row.min_capacity_searched = true;
            row.min_capacity = probe.min_capacity(capacity);
          }
          if (breakdown || !html.empty()) row.breakdown = breakdown_at_peak(t, o, row.result);
          if (breakdown)
            std::fprintf(stderr, "%s [%s]: %s\n", path.c_str(), c.empty() ? "defaults" : c.c_str(),
                         format_breakdown(*row.breakdown).c_str());
        } catch (const std::exception& e) {
          std::fprintf(stderr, "stitch-replay: error: %s [%s]: %s\n", path.c_str(), c.c_str(), e.what());
          status = 1;
          continue;
        }
        report.rows.push_back(std::move(row));
      }
      complete_explanations(report, path);
      if (!plot.empty()) {
        std::string file = plot;
        if (traces.size() > 1 || w.devices.size() > 1) {
          const auto dot = file.rfind(".svg");
          file = (dot == std::string::npos ? file : file.substr(0, dot)) + "-" +
                 std::to_string(plot_index++) + ".svg";
        }
        std::ofstream(file) << format_svg(report);
      }
      if (!json) std::fputs((format_table(report) + "\n").c_str(), stdout);
      reports.push_back(std::move(report));
    }
  }
  if (json) std::fputs(format_json(reports).c_str(), stdout);
  if (!html.empty()) {
    std::ofstream out(html);
    out << format_html(reports);
    if (!out) {
      std::fprintf(stderr, "stitch-replay: error: cannot write %s\n", html.c_str());
      status = 1;
    }
  }
  return status;
}
