// tools/stitch_tracegen.cpp — the stitch-tracegen command: writes a synthetic allocation trace of a
// training workload known to fragment caching allocators, as a PyTorch memory-snapshot pickle that
// stitch-replay (and PyTorch's memory viewer) read. Deterministic: the same pattern, seed and steps
// give the same file, byte for byte.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "diagnostics/snapshot_writer.hpp"
#include "stitch/errors.hpp"
#include "tools/common/arg_reader.hpp"
#include "tools/stitch_replay/report.hpp"
#include "tools/stitch_replay/trace_file.hpp"
#include "tools/tracegen/device_run.hpp"
#include "tools/tracegen/tracegen.hpp"

namespace {

constexpr const char* kUsage = R"(usage: stitch-tracegen --pattern NAME [--seed N] [--steps K] [--no-frames]
                       [--device-memory SIZE [--alloc-conf CONF]] -o FILE
       stitch-tracegen --list

Writes a synthetic allocation trace (alloc / free_requested / free_completed events, no segments)
imitating a training workload that fragments caching allocators, as a PyTorch memory snapshot
(FILE.pickle; FILE.json writes the same structure as JSON). Replay it with stitch-replay.

options:
  --pattern NAME  the workload (see --list)
  --seed N        random seed (default 1): sequence lengths, routing, ...
  --steps K       training steps (default: the pattern's, 10k-50k events)
  --no-frames     no stack frame naming each tensor (smaller files)
  --device-memory SIZE
                  run the program on a simulated device of SIZE (e.g. 10GiB; 512 MiB of it held
                  by the CUDA context) through stitch with PyTorch's caching behaviour, recording
                  as PyTorch does, until a request fails: the file then has segments, segment
                  events and the `oom` entry of a run that ran out of memory
  --alloc-conf CONF
                  with --device-memory: the run's PYTORCH_CUDA_ALLOC_CONF settings (e.g.
                  expandable_segments:True; default PyTorch's defaults)
  -o FILE         where to write
  --list          print the patterns
  -h, --help      this text
)";

std::uint64_t parse_number(const std::string& opt, const std::string& text) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-')
    throw stitch::error(opt + " needs a non-negative integer, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  namespace tg = stitch::tracegen;
  std::string pattern, out;
  std::uint64_t seed = 1;
  tg::Options options;
  tg::DeviceRun run;
  try {
    for (stitch::tools::ArgReader args(argc, argv); args.next();) {
      const std::string& a = args.current();
      auto value = [&] { return args.value(); };
      if (a == "-h" || a == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--list") {
        for (const tg::PatternInfo& p : tg::patterns())
          std::printf("%-20s %s (default %zu steps)\n", p.name.c_str(), p.summary.c_str(), p.default_steps);
        return 0;
      } else if (a == "--pattern") {
        pattern = value();
      } else if (a == "--seed") {
        seed = parse_number(a, value());
      } else if (a == "--steps") {
        options.steps = parse_number(a, value());
        if (options.steps == 0) throw stitch::error("--steps must be at least 1");
      } else if (a == "--device-memory") {
        run.memory = stitch::replay_cli::parse_size(value());
      } else if (a == "--alloc-conf") {
        run.alloc_conf = value();
      } else if (a == "--no-frames") {
        options.frames = false;
      } else if (a == "-o" || a == "--output") {
        out = value();
      } else {
        throw stitch::error("unknown argument " + a + " (see --help)");
      }
    }
    if (pattern.empty()) throw stitch::error("no --pattern given (see --list)");
    if (out.empty()) throw stitch::error("no output file given (-o FILE)");
    if (!run.alloc_conf.empty() && run.memory == 0) throw stitch::error("--alloc-conf needs --device-memory");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stitch-tracegen: %s\n", e.what());
    return 2;
  }

  try {
    stitch::Snapshot snap = tg::generate(pattern, seed, options);
    if (run.memory != 0) {
      snap = tg::record_on_device(snap, run);
      stitch::detail::write_snapshot_file(snap, out, tg::device_run_meta(pattern, seed, options, run));
    } else {
      stitch::detail::write_snapshot_file(snap, out, tg::snapshot_meta(pattern, seed, options));
    }
    const stitch::replay_cli::TraceFile w = stitch::replay_cli::trace_file_from_snapshot(snap, out);
    const std::size_t peak = w.devices.empty() ? 0 : stitch::replay::peak_requested(w.devices[0]);
    std::fprintf(stderr, "stitch-tracegen: wrote %s: %zu events, peak requested %s\n", out.c_str(),
                 snap.device_traces[0].size(), stitch::replay_cli::human_size(peak).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stitch-tracegen: %s\n", e.what());
    return 1;
  }
  return 0;
}
