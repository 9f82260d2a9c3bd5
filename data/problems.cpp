// Reporting a dataset's problems (see problems.h).
#include "data/problems.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "runtime/check.h"
#include "runtime/plural.h"

namespace yolo::data {

namespace {

// The kinds in the order first met, each with its problems.
std::vector<std::pair<std::string, std::vector<const Problem*>>> by_kind(const Split& split) {
  std::vector<std::pair<std::string, std::vector<const Problem*>>> kinds;
  std::map<std::string, size_t> index;
  for (const Problem& p : split.problems) {
    auto [it, fresh] = index.emplace(p.kind, kinds.size());
    if (fresh) kinds.push_back({p.kind, {}});
    kinds[it->second].second.push_back(&p);
  }
  return kinds;
}

int64_t listed(const Split& split) { return static_cast<int64_t>(split.samples.size()) + split.left_out(); }

}  // namespace

int64_t problem_count(const Dataset& dataset) {
  return static_cast<int64_t>(dataset.train.problems.size() + dataset.valid.problems.size());
}

std::string problem_report(const Dataset& dataset, int per_kind) {
  std::string out;
  for (const Split* split : {&dataset.train, &dataset.valid}) {
    if (split->problems.empty()) continue;
    out += split->name + ": " + counted(static_cast<int64_t>(split->problems.size()), "problem", "problems") + ", " +
           counted(split->left_out(), "item", "items") + " left out of " + std::to_string(listed(*split)) +
           " listed:\n";
    for (const auto& [kind, problems] : by_kind(*split)) {
      out += "  " + kind + ": " + std::to_string(problems.size()) + "\n";
      for (size_t k = 0; k < problems.size() && static_cast<int>(k) < per_kind; ++k)
        out += "    " + problems[k]->message + "\n";
      if (static_cast<int>(problems.size()) > per_kind)
        out += "    ... and " + std::to_string(problems.size() - static_cast<size_t>(per_kind)) + " more\n";
    }
  }
  return out;
}

void write_problem_list(const Dataset& dataset, const std::string& path) {
  std::error_code ec;
  if (auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) std::filesystem::create_directories(dir, ec);
  std::ofstream out(path);
  out << "# problems found when opening " << dataset.source << " (each left its item out unless marked)\n";
  for (const Split* split : {&dataset.train, &dataset.valid})
    for (const auto& [kind, problems] : by_kind(*split)) {
      out << "\n# " << split->name << ": " << kind << ": " << problems.size() << "\n";
      for (const Problem* p : problems) out << p->message << (p->item ? "" : "  (nothing left out)") << "\n";
    }
  if (!out) throw Error("cannot write the dataset's problem list " + path);
}

void check_usable(const Dataset& dataset, bool strict, const std::string& list_path) {
  const std::string see = list_path.empty() ? "" : " (all of them: " + list_path + ")";
  if (strict && problem_count(dataset) > 0)
    throw Error(dataset.source + ": " + counted(problem_count(dataset), "problem", "problems") +
                " in the dataset, and --strict stops at any" + see);
  for (const Split* split : {&dataset.train, &dataset.valid}) {
    const int64_t bad = split->left_out(), all = listed(*split);
    if (all > 0 && static_cast<double>(bad) > kMaxUnusableFraction * static_cast<double>(all))
      throw Error(dataset.source + ": " + std::to_string(bad) + " of the " + split->name + " split's " +
                  std::to_string(all) + " items are unusable, more than " +
                  std::to_string(static_cast<int>(kMaxUnusableFraction * 100)) +
                  "%: the dataset is probably wrong (its format, its paths or its class names), not a few files" + see);
  }
  if (dataset.train.samples.empty()) throw Error(dataset.source + ": the train split has no usable image" + see);
}

}  // namespace yolo::data
