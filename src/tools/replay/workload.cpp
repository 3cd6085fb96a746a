// tools/replay/workload.cpp — reads trace files into workloads.
#include "tools/replay/workload.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "stitch/errors.hpp"
#include "tools/formats/pickle_reader.hpp"
#include "tools/formats/rmm_csv.hpp"

namespace stitch::replay {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(fmt::format("{}: cannot open file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Workload workload_from_snapshot(const Snapshot& snapshot, std::string name) {
  Workload w;
  w.name = std::move(name);
  w.devices = workloads_from_snapshot(snapshot);
  return w;
}

Workload workload_from_rmm_csv(std::string_view text, std::string name) {
  Snapshot snapshot = detail::snapshot_from_rmm_csv(text, name);
  return workload_from_snapshot(snapshot, std::move(name));
}

Workload read_workload(const std::string& path) {
  const std::string data = read_file(path);
  const bool csv = path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  if (csv || data.starts_with("Thread,")) return workload_from_rmm_csv(data, path);
  if (!data.empty() && (data[0] == '{' || data[0] == '['))
    throw error(fmt::format("{}: JSON snapshots are not supported by the replay reader; use the "
                            "pickle form", path));
  const detail::PyValue root = detail::read_pickle(data, path);
  return workload_from_snapshot(detail::snapshot_from_pyvalue(root, path), path);
}

}  // namespace stitch::replay
