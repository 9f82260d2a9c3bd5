// The run folder's checkpoints, kept so that a damaged disk or a stop at the wrong moment loses
// at most one save: last.ckpt and the one before it, prev.ckpt (each checksummed; written to a
// temporary file, flushed, then renamed into place). --resume takes last.ckpt, or prev.ckpt
// when last.ckpt is missing, truncated or corrupt, saying what that costs. Before training, the
// folder is checked for what a save needs, so a full disk is an error now, not an hour in.
#pragma once
#include <cstdint>
#include <string>

#include "graph/weights.h"

namespace yolo::graph {

struct ResumePoint {
  Checkpoint checkpoint;
  std::string path;    // the file it came from (last.ckpt or prev.ckpt)
  std::string notice;  // why prev.ckpt was taken ("" when last.ckpt was)
};

// The checkpoint --resume continues from in `dir`. Throws, naming both files' problems, when
// neither is usable.
ResumePoint find_resume_checkpoint(const std::string& dir);

// Saves `checkpoint` as dir/last.ckpt, the one it replaces kept as dir/prev.ckpt.
void save_checkpoint(const std::string& dir, const Checkpoint& checkpoint);

// Before training: `dir` exists (created), is writable, and has room for a save: besides the
// files already there, last.ckpt, prev.ckpt and the temporary file of the next one (three
// checkpoints of checkpoint_bytes), and `weights_files` .weights files of weights_bytes plus one
// temporary. Temporary files left by processes that no longer run (a second signal, a kill
// during a save) are removed first. Throws a clear error otherwise.
void check_output_folder(const std::string& dir, uint64_t checkpoint_bytes, uint64_t weights_bytes, int weights_files);

// "1.5 GB", "12.0 MB", "300 bytes": sizes in messages.
std::string bytes_text(uint64_t bytes);

}  // namespace yolo::graph
