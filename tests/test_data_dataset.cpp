// Dataset reading shared by the formats, darknet .data lists and image folders: box checks,
// YOLO label lines, names files, the image -> label path rule, detection, and bad input.
#include <doctest/doctest.h>

#include <string>

#include "data/dataset.h"
#include "data/problems.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::TempDir;
using yolo::testing::write_text_file;

namespace {

// The message of the yolo::Error `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const yolo::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("YOLO label lines become boxes; comments, blank lines and exact values kept") {
  Sample sample;
  LabelCounts counts;
  parse_yolo_labels("0 0.5 0.25 0.125 0.0625\n\n# a comment\n2 0.1 0.2 0.05 0.1  # trailing\n", "a.txt", 3, sample,
                    counts);
  REQUIRE(sample.boxes.size() == 2);
  CHECK(sample.boxes[0].class_id == 0);
  CHECK(sample.boxes[0].x == 0.5f);
  CHECK(sample.boxes[0].y == 0.25f);
  CHECK(sample.boxes[0].w == 0.125f);
  CHECK(sample.boxes[0].h == 0.0625f);
  CHECK(sample.boxes[1].class_id == 2);
  CHECK(counts.clipped_boxes == 0);
}

TEST_CASE("a label file's byte-order mark is skipped; polygon rows are read as their bounding boxes, counted") {
  Sample sample;
  LabelCounts counts;
  // A UTF-8 BOM before the first row (Windows editors write one), CRLF line ends.
  parse_yolo_labels("\xEF\xBB\xBF" "1 0.5 0.25 0.125 0.0625\r\n", "bom.txt", 3, sample, counts);
  REQUIRE(sample.boxes.size() == 1);
  CHECK(sample.boxes[0].class_id == 1);
  CHECK(sample.boxes[0].x == 0.5f);
  CHECK(sample.boxes[0].h == 0.0625f);
  CHECK(counts.polygon_rows == 0);
  // A triangle and a quadrilateral (class x1 y1 x2 y2 ...): their bounds, whatever the points' order.
  Sample polygons;
  parse_yolo_labels("2 0.25 0.75 0.5 0.125 0.75 0.5\n0 0.625 0.25 0.125 0.25 0.125 0.5 0.625 0.5\n"
                    "1 0.5 0.5 0.25 0.25\n",
                    "seg.txt", 3, polygons, counts);
  REQUIRE(polygons.boxes.size() == 3);
  CHECK(polygons.boxes[0].class_id == 2);
  CHECK(polygons.boxes[0].x == 0.5f);  // x from 0.25 to 0.75
  CHECK(polygons.boxes[0].w == 0.5f);
  CHECK(polygons.boxes[0].y == 0.4375f);  // y from 0.125 to 0.75
  CHECK(polygons.boxes[0].h == 0.625f);
  CHECK(polygons.boxes[1].class_id == 0);
  CHECK(polygons.boxes[1].x == 0.375f);  // x from 0.125 to 0.625
  CHECK(polygons.boxes[1].y == 0.375f);  // y from 0.25 to 0.5
  CHECK(polygons.boxes[1].w == 0.5f);
  CHECK(polygons.boxes[1].h == 0.25f);
  CHECK(polygons.boxes[2].w == 0.25f);  // a box row beside them, as ever
  CHECK(counts.polygon_rows == 2);
  CHECK(contains(counts.summary(), "2 polygon rows read as their bounding boxes"));
  // Other counts stay errors naming the line: 6 values, 2 points (7 needed), an even count, a bad point.
  auto parse = [&](const std::string& text) {
    Sample s;
    return error_of([&] { parse_yolo_labels(text, "seg.txt", 3, s, counts); });
  };
  CHECK(contains(parse("0 0.1 0.1 0.2 0.2 0.3\n"), "seg.txt:1: expected 5 values"));
  CHECK(contains(parse("0 0.1 0.1 0.2 0.2 0.3 0.3 0.4\n"), "(or a polygon: class x1 y1 x2 y2 x3 y3 ..., an odd count "
                                                          "of 7 or more), found 8"));
  CHECK(contains(parse("\n0 0.1 0.1 0.2 zero 0.3 0.3\n"), "seg.txt:2: 'zero' is not a number (a polygon row"));
  CHECK(contains(parse("0 0.1 0.1 0.2 0.2 0.3 nan\n"), "'nan' is not a number"));
  CHECK(contains(parse("0 1 1 200 1 200 150\n"), "far outside [0, 1]"));  // pixel coordinates by mistake
  std::string huge = "0";
  for (int k = 0; k < 1001; ++k) huge += " 0.5 0.5";
  CHECK(contains(parse(huge + "\n"), "found more than 2001"));
  // The mark is skipped only at the start of the file.
  CHECK(contains(parse("0 0.5 0.5 0.1 0.1\n\xEF\xBB\xBF" "0 0.5 0.5 0.1 0.1\n"), "seg.txt:2: class id"));
}

TEST_CASE("malformed label lines name the file and line") {
  Sample sample;
  LabelCounts counts;
  auto parse = [&](const std::string& text) {
    return error_of([&] { parse_yolo_labels(text, "dir/x.txt", 3, sample, counts); });
  };
  CHECK(contains(parse("0 0.5 0.5 0.1\n"), "dir/x.txt:1: expected 5 values"));
  CHECK(contains(parse("0 0.5 0.5 0.1 0.1\n0 0.5 0.5 0.1 0.1 7\n"), "dir/x.txt:2: expected 5 values"));
  CHECK(contains(parse("a 0.5 0.5 0.1 0.1\n"), "dir/x.txt:1: class id 'a' is not an integer"));
  CHECK(contains(parse("1.0 0.5 0.5 0.1 0.1\n"), "not an integer"));
  CHECK(contains(parse("\n\n0 0.5 0.5x 0.1 0.1\n"), "dir/x.txt:3: '0.5x' is not a number"));
  CHECK(contains(parse("3 0.5 0.5 0.1 0.1\n"), "dir/x.txt:1: class id 3 is outside [0, 3)"));
  CHECK(contains(parse("-1 0.5 0.5 0.1 0.1\n"), "class id -1"));
  CHECK(contains(parse("0 nan 0.5 0.1 0.1\n"), "not finite"));
  // Pixel coordinates by mistake.
  CHECK(contains(parse("0 320 240 50 40\n"), "dir/x.txt:1: box (320 240 50 40) is far outside [0, 1]"));
  CHECK(contains(parse("0 0.5 0.5 -0.1 0.1\n"), "far outside"));
}

TEST_CASE("boxes slightly outside the image are clipped and counted; empty ones dropped; more than 90 dropped") {
  Sample sample;
  LabelCounts counts;
  parse_yolo_labels("1 1.005 0.5 0.2 0.2\n0 0.5 0.5 0 0.1\n", "b.txt", 2, sample, counts);
  REQUIRE(sample.boxes.size() == 1);
  CHECK(counts.clipped_boxes == 1);
  CHECK(counts.empty_boxes == 1);
  CHECK(yolo::testing::close(sample.boxes[0].x, (0.905 + 1.0) / 2, 1e-6, 0));
  CHECK(yolo::testing::close(sample.boxes[0].w, 1.0 - 0.905, 1e-6, 0));

  Sample full;
  LabelCounts full_counts;
  std::string many;
  for (int i = 0; i < 95; ++i) many += "0 0.5 0.5 0.1 0.1\n";
  parse_yolo_labels(many, "c.txt", 1, full, full_counts);
  CHECK(full.boxes.size() == kMaxBoxes);
  CHECK(full_counts.boxes_over_limit == 95 - kMaxBoxes);
}

TEST_CASE("label path follows darknet's images -> labels rule") {
  CHECK(label_path_for_image("/d/images/train/a.jpg") == "/d/labels/train/a.txt");
  CHECK(label_path_for_image("images/x.png") == "labels/x.txt");
  CHECK(label_path_for_image("/voc/VOC2007/JPEGImages/0001.jpg") == "/voc/VOC2007/labels/0001.txt");
  CHECK(label_path_for_image("/a/images/b/images/c.jpeg") == "/a/images/b/labels/c.txt");
  CHECK(label_path_for_image("/a.b/images/noext") == "/a.b/labels/noext.txt");
}

TEST_CASE("names files: one per line, blanks ignored, duplicates and empty files rejected") {
  TempDir dir;
  write_text_file(dir / "ok.names", "cat\n\n  dog \r\nbird\n");
  CHECK(read_names_file(dir / "ok.names") == std::vector<std::string>{"cat", "dog", "bird"});
  write_text_file(dir / "dup.names", "cat\ndog\ncat\n");
  CHECK(contains(error_of([&] { read_names_file(dir / "dup.names"); }), "dup.names:3: class name 'cat' repeats line 1"));
  write_text_file(dir / "empty.names", "\n\n");
  CHECK(contains(error_of([&] { read_names_file(dir / "empty.names"); }), "has no class names"));
  CHECK(contains(error_of([&] { read_names_file(dir / "none.names"); }), "none.names"));
}

namespace {

// A tiny darknet-layout dataset: images are empty placeholder files (reading checks only that
// they exist; decoding is the loader's business).
void make_darknet_set(const TempDir& dir) {
  write_text_file(dir / "set/images/a.jpg", "x");
  write_text_file(dir / "set/images/b.jpg", "x");
  write_text_file(dir / "set/images/c.jpg", "x");
  write_text_file(dir / "set/labels/a.txt", "0 0.5 0.5 0.2 0.2\n1 0.25 0.25 0.1 0.1\n");
  write_text_file(dir / "set/labels/b.txt", "");  // background
  // c.jpg has no label file: background, counted
  write_text_file(dir / "set/train.txt", "images/a.jpg\nimages/b.jpg\n\nimages/c.jpg\n");
  write_text_file(dir / "set/valid.txt", "images/a.jpg\n");
  write_text_file(dir / "set/obj.names", "cat\ndog\n");
  write_text_file(dir / "set/obj.data", "# comment\nclasses = 2\ntrain = train.txt\nvalid=valid.txt\nnames = obj.names\nbackup = backup/\n");
}

}  // namespace

TEST_CASE("darknet .data: lists resolved next to the file, labels read, background images counted") {
  TempDir dir;
  make_darknet_set(dir);
  Dataset d = open_dataset(dir / "set/obj.data");
  CHECK(d.format == Format::Darknet);
  CHECK(d.class_names == std::vector<std::string>{"cat", "dog"});
  REQUIRE(d.train.samples.size() == 3);
  CHECK(d.train.samples[0].image == dir / "set/images/a.jpg");
  CHECK(d.train.samples[0].boxes.size() == 2);
  CHECK(d.train.samples[0].boxes[1].class_id == 1);
  CHECK(d.train.samples[1].boxes.empty());
  CHECK(d.train.counts.missing_label_files == 1);
  CHECK(d.train.counts.images == 3);
  CHECK(d.train.counts.boxes == 2);
  CHECK(d.valid.samples.size() == 1);
  // The folder holding exactly one .data file is detected as darknet too.
  CHECK(open_dataset(dir / "set").format == Format::Darknet);
  // --strict turns a missing label file into an error.
  OpenOptions strict;
  strict.strict = true;
  CHECK(contains(error_of([&] { open_dataset(dir / "set/obj.data", strict); }), "no label file"));
}

TEST_CASE("darknet .data: bad input names the file and line") {
  TempDir dir;
  make_darknet_set(dir);
  write_text_file(dir / "set/bad1.data", "classes = 2\ntrain train.txt\n");
  CHECK(contains(error_of([&] { read_darknet(dir / "set/bad1.data", {}); }), "bad1.data:2: expected 'key = value'"));
  write_text_file(dir / "set/bad2.data", "classes = two\ntrain = train.txt\n");
  CHECK(contains(error_of([&] { read_darknet(dir / "set/bad2.data", {}); }), "bad2.data:1: classes must be"));
  write_text_file(dir / "set/bad3.data", "classes = 3\ntrain = train.txt\nnames = obj.names\n");
  CHECK(contains(error_of([&] { read_darknet(dir / "set/bad3.data", {}); }), "classes = 3 but the names file has 2"));
  write_text_file(dir / "set/bad4.data", "classes = 2\n");
  CHECK(contains(error_of([&] { read_darknet(dir / "set/bad4.data", {}); }), "no 'train = LIST' line"));
  write_text_file(dir / "set/bad5.data", "classes = 2\ntrain = nowhere.txt\n");
  CHECK(contains(error_of([&] { read_darknet(dir / "set/bad5.data", {}); }), "nowhere.txt"));
  // A class id beyond classes in a label file: that item left out, with file and line.
  write_text_file(dir / "set/labels/b.txt", "0 0.5 0.5 0.1 0.1\n5 0.5 0.5 0.1 0.1\n");
  Dataset d = open_dataset(dir / "set/obj.data");
  REQUIRE(d.train.problems.size() == 1);
  CHECK(d.train.problems[0].kind == "unknown class");
  CHECK(contains(d.train.problems[0].message, "labels/b.txt:2: class id 5"));
  CHECK(d.train.samples.size() == 2);
}

TEST_CASE("missing images are left out as problems; --strict, too many unusable and none usable stop") {
  TempDir dir;
  make_darknet_set(dir);
  write_text_file(dir / "set/train.txt", "images/a.jpg\nimages/gone.jpg\n");
  Dataset d = open_dataset(dir / "set/obj.data");
  CHECK(d.train.samples.size() == 1);
  CHECK(d.train.counts.missing_images == 1);
  REQUIRE(d.train.problems.size() == 1);
  CHECK(d.train.problems[0].kind == "missing image");
  CHECK(contains(d.train.problems[0].message, "gone.jpg: does not exist"));
  CHECK(contains(error_of([&] { check_usable(d, true, "runs/x/dataset_problems.txt"); }),
                 "1 problem in the dataset, and --strict stops at any (all of them: runs/x/dataset_problems.txt)"));
  // 1 of 2 unusable is more than 5%: the dataset is probably wrong.
  CHECK(contains(error_of([&] { check_usable(d, false, ""); }), "1 of the train split's 2 items are unusable"));

  write_text_file(dir / "set/train.txt", "\n");
  CHECK(contains(error_of([&] { check_usable(open_dataset(dir / "set/obj.data"), false, ""); }),
                 "the train split has no usable image"));
}

TEST_CASE("image folders: flat, images/{train,val} and {train,val}/images layouts") {
  TempDir dir;
  write_text_file(dir / "flat/images/1.png", "x");
  write_text_file(dir / "flat/images/2.JPG", "x");
  write_text_file(dir / "flat/images/notes.md", "not an image");
  write_text_file(dir / "flat/labels/1.txt", "0 0.5 0.5 0.5 0.5\n");
  write_text_file(dir / "flat/classes.txt", "thing\n");
  Dataset flat = open_dataset(dir / "flat");
  CHECK(flat.format == Format::Folders);
  REQUIRE(flat.train.samples.size() == 2);
  CHECK(flat.train.samples[0].boxes.size() == 1);
  CHECK(flat.train.counts.missing_label_files == 1);
  CHECK(flat.valid.samples.empty());

  write_text_file(dir / "u/images/train/a.jpg", "x");
  write_text_file(dir / "u/images/val/b.jpg", "x");
  write_text_file(dir / "u/labels/val/b.txt", "1 0.5 0.5 0.5 0.5\n");
  write_text_file(dir / "u/my.names", "a\nb\n");
  Dataset u = open_dataset(dir / "u");
  CHECK(u.train.samples.size() == 1);
  REQUIRE(u.valid.samples.size() == 1);
  CHECK(u.valid.samples[0].boxes[0].class_id == 1);

  write_text_file(dir / "s/train/images/a.bmp", "x");
  write_text_file(dir / "s/validation/images/b.jpeg", "x");
  write_text_file(dir / "s/validation/labels/b.txt", "0 0.5 0.5 0.5 0.5\n");
  OpenOptions with_names;
  with_names.names_file = dir / "u/my.names";
  with_names.force_format = true;
  with_names.format = Format::Folders;
  Dataset s = open_dataset(dir / "s", with_names);
  CHECK(s.class_names.size() == 2);
  CHECK(s.train.samples.size() == 1);
  CHECK(s.valid.samples.size() == 1);

  write_text_file(dir / "nonames/images/a.jpg", "x");
  CHECK(contains(error_of([&] { open_dataset(dir / "nonames"); }), "no names file"));
}

TEST_CASE("format detection: unknown things are refused with what was expected") {
  TempDir dir;
  write_text_file(dir / "empty/readme.txt", "x");
  CHECK(contains(error_of([&] { open_dataset(dir / "empty"); }), "not a dataset this program recognises"));
  CHECK(contains(error_of([&] { open_dataset(dir / "missing"); }), "no such file or directory"));
  write_text_file(dir / "list.txt", "x");
  CHECK(contains(error_of([&] { open_dataset(dir / "list.txt"); }), "expected a darknet .data file"));
  CHECK(contains(error_of([&] { parse_format("yaml"); }), "choose darknet, folders, voc or coco"));
  CHECK(parse_format("voc") == Format::Voc);
}
