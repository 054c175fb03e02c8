#pragma once
// TensorBoard event files written without TensorFlow: TFRecord framing (length, masked CRC32C
// of the length, data, masked CRC32C of the data) around hand-encoded tensorflow.Event protos
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto): scalars as
// Summary.Value.simple_value, text as a string tensor with the "text" plugin's metadata.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident::tensorboard {

// CRC-32C (Castagnoli), as TFRecord uses it, and its "masked" form (rotated and offset, so
// that a CRC of data that itself holds CRCs stays well distributed).
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: the framing around `data`.
std::string tfrecord(std::string_view data);

// Serialized Event protos.
std::string file_version_event(double wall_time);  // the first record of every file
struct Scalar {
  std::string tag;
  float value;
};
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars);
std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);

// dir/events.out.tfevents.<seconds>.<host>.<pid>: one file per start of a run, appended to
// record by record (each record is one write(), so a reader sees whole records as they come).
class EventWriter {
 public:
  // Creates the file and writes its first record. Throws trident::Error naming the path.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // Appends one record; returns 0 or the errno of a failed write (the file then stays whole:
  // a partly written record is cut off again).
  int write_event(const std::string& event);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Seconds since the epoch, as Event.wall_time.
double wall_time_now();

}  // namespace trident::tensorboard
