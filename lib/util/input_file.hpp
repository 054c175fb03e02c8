#pragma once
// Reading a small input file named on the command line (a config, a tokenizer.json, a prompt,
// a hardware description) whole, safely: only a regular file, and no more than its format may
// hold. Opening a FIFO for reading blocks until a writer comes (ignoring SIGTERM meanwhile) and
// /dev/zero never ends, so both are refused before anything is read.
#include <cstdint>
#include <string>

namespace trident {

struct InputFile {
  std::string shown;     // names the file in errors (its path, or a chain of includes)
  std::string kind;      // what such a file is, in errors: "config", "tokenizer", "prompt"
  int64_t max_bytes = 0; // the most a file of this kind may have
  std::string needs;     // what the option wants, ending errors: "--config needs a TOML file"
};

// The file's whole text. trident::Error, one line "<shown>: <problem>: <needs>" where
// relevant, if it cannot be opened or read, is no regular file (a directory, a FIFO, a device,
// a socket: named) or holds more than max_bytes (checked before reading, and while reading for
// a file that grows).
std::string read_input_file(const std::string& path, const InputFile& file);

}  // namespace trident
