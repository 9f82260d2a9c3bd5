// Datasets as users already have them: darknet .data lists, images/ + labels/ folders, Pascal
// VOC (imageai's layout) and COCO JSON. Opening one reads and checks every label and verifies
// every image up front (data/verify.h), in one pass that finds every problem: an unusable item
// (a malformed label file, a box with swapped corners, an unknown class, a missing, corrupt or
// truncated image) is left out and reported with its file and line, all of them together
// (data/problems.h decides whether training may go on).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/check.h"

namespace yolo::data {

// Boxes per image that training uses (darknet's max_boxes; kernels/yolo_loss.h's kYoloMaxTruths).
constexpr int kMaxBoxes = 90;

// One labelled object: centre and size normalised by the original image's width and height.
struct Box {
  float x = 0, y = 0, w = 0, h = 0;
  int class_id = 0;
  bool difficult = false;  // VOC's flag: kept, and ignored by evaluation
};

struct Sample {
  std::string image;        // path as the loader opens it
  std::vector<Box> boxes;   // at most kMaxBoxes
  // COCO: the file's image id. The other formats: the 1-based position of the image in its split
  // as listed (the list file's lines, the sorted images or annotation files), items left out
  // included: the id data/synthetic.h's COCO files give the same image.
  int64_t image_id = -1;
};

// What was repaired or dropped while reading labels; reported, never silent.
struct LabelCounts {
  int64_t images = 0;
  int64_t boxes = 0;
  int64_t missing_label_files = 0;  // read as background images
  int64_t clipped_boxes = 0;        // a coordinate slightly outside [0, 1], clipped
  int64_t empty_boxes = 0;          // zero width or height after clipping, dropped
  int64_t boxes_over_limit = 0;     // beyond kMaxBoxes in one image, dropped
  int64_t difficult_boxes = 0;
  int64_t missing_images = 0;       // listed but not on disk: left out (an error with strict)
  int64_t polygon_rows = 0;         // darknet rows of a polygon (class x1 y1 x2 y2 ...): their bounds
  LabelCounts& operator+=(const LabelCounts& o);
  std::string summary() const;  // one line, e.g. "120 images, 431 boxes, 2 clipped, ..."
};

// A problem found while opening a dataset. item: the image and its labels were left out
// (otherwise only reported, e.g. an annotation that names no image).
struct Problem {
  std::string kind;     // groups the report: "malformed label file", "truncated image", ...
  std::string message;  // file (and line) first: "set/labels/a.txt:3: expected 5 values ..."
  bool item = true;
};

// Thrown by the readers' per-item code: the item is left out with this problem.
class ItemError : public Error {
 public:
  ItemError(std::string kind, const std::string& message) : Error(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

struct Split {
  std::string name;  // "train" or "valid"
  std::vector<Sample> samples;  // the usable items
  LabelCounts counts;
  std::vector<Problem> problems;  // in the order found
  int64_t left_out() const;       // problems that left an item out
};

enum class Format { Darknet, Folders, Voc, Coco };
const char* format_name(Format format);                // "darknet", "folders", "voc", "coco"
Format parse_format(const std::string& name);          // throws yolo::Error naming the choices

struct Dataset {
  Format format = Format::Darknet;
  std::string source;       // what the user passed
  std::string description;  // one line: what was detected and where, for the log
  std::vector<std::string> class_names;
  std::vector<int64_t> category_ids;  // COCO: each class's category id in the file (empty otherwise)
  Split train, valid;       // valid may be empty (no validation split)
  std::vector<std::string> warnings;  // for the log: what was repaired or left out, and where
};

struct OpenOptions {
  std::string names_file;  // fixes class names and order (required where the format has none)
  bool force_format = false;
  Format format = Format::Darknet;  // used when force_format
  bool strict = false;              // a missing label file is an error (problems: see data/problems.h)
  // Decode every image once (data/verify.h), in `threads` threads (0: the machine's), results
  // cached in `cache_file` ("": beside the dataset when writable, else none). The CLI turns it
  // on; tests of the readers leave it off.
  bool verify_images = false;
  int threads = 0;
  std::string cache_file;
};

// Detects the format of `path` (a .data file, a COCO .json, or a directory), reads it, checks
// every label and verifies every image. Items with a problem are left out and listed in their
// split's `problems`; what makes the whole dataset unreadable (no .data file, a names file with
// duplicates, a COCO file that is not JSON) throws yolo::Error naming the file and line.
Dataset open_dataset(const std::string& path, const OpenOptions& options = {});

// ---- building blocks shared by the format readers ---------------------------------------

// Validates a box given as normalised centre/size read from `where` (e.g. "a.txt:3"):
// coordinates more than kFarOutside outside [0, 1] are an error (pixel coordinates given by
// mistake); slightly outside is clipped and counted; an empty box is dropped and counted; a
// class id outside [0, classes) is an error. Appends to sample.boxes unless it is full
// (then counts boxes_over_limit).
constexpr float kFarOutside = 0.01f;
void add_normalized_box(Sample& sample, Box box, int classes, const std::string& where, LabelCounts& counts);

// For the pixel-box formats (VOC, COCO): what is wrong with the continuous box [x0, x1] x [y0, y1]
// that goes more than kFarOutside past an edge of a width x height image, "" when it does not:
// "extends past the image's right edge (xmax 900 > width 160)", or "lies entirely outside the
// image, past its ...", each edge crossed told by the format's own comparison in `words`.
struct EdgeWords {
  std::string left, top, right, bottom;  // e.g. VOC's "xmin -3 < 1", COCO's "x + width 40 > 17"
};
std::string beyond_image(double x0, double y0, double x1, double y1, double width, double height,
                         const EdgeWords& words);

// Reads a names file (one class name per line; blank lines and surrounding spaces ignored;
// duplicates are an error naming both lines).
std::vector<std::string> read_names_file(const std::string& path);

// Parses YOLO text labels ("class cx cy w h" per line, '#' comments and blank lines allowed)
// into `sample`; errors name file and line. A UTF-8 byte-order mark at the start is skipped; a
// row of a class and three or more points ("class x1 y1 x2 y2 x3 y3 ...", an odd count of 7 up
// to kMaxPolygonValues values, as segmentation sets write them) is read as the polygon's bounding
// box and counted in polygon_rows.
constexpr size_t kMaxPolygonValues = 2001;  // a class and 1000 points
void parse_yolo_labels(const std::string& text, const std::string& file, int classes, Sample& sample,
                       LabelCounts& counts);

// Reads the YOLO label file at `label_path` into `sample`; a missing file is a background
// image (counted in missing_label_files); an unreadable one is an error.
void read_yolo_label_file(const std::string& label_path, int classes, Sample& sample, LabelCounts& counts);

// Reads the sample's YOLO label file and appends it to `split`; a label file with a problem
// leaves the sample out with the problem recorded instead (its counts not added).
void add_labelled_sample(Sample sample, const std::string& label_path, int classes, Split& split);

// A relative path from a list or config file: as given if it exists from the working
// directory (darknet's rule), else relative to `base_dir` (the folder of the file naming it).
std::string resolve_listed_path(const std::string& path, const std::string& base_dir);

// The label file darknet expects for an image: ".../images/..." -> ".../labels/...", and the
// extension replaced by ".txt" (also for JPEGImages/ as in VOC-derived lists).
std::string label_path_for_image(const std::string& image_path);

// After a reader: leaves out samples whose image is not on disk (a "missing image" problem),
// verifies the images (options.verify_images), and fills counts.images/boxes.
void finish_split(Split& split, const std::string& source, const OpenOptions& options,
                  std::vector<std::string>& warnings);

// Format readers (data/darknet.cpp, data/folders.cpp, data/voc.cpp, data/coco.cpp).
Dataset read_darknet(const std::string& data_file, const OpenOptions& options);
Dataset read_folders(const std::string& root, const OpenOptions& options);
Dataset read_voc(const std::string& root, const OpenOptions& options);
Dataset read_coco(const std::string& path, const OpenOptions& options);

}  // namespace yolo::data
