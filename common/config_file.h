// Options from a file, `-f FILE` or `--config FILE`: one option per line as `name value`, the name
// a long option without its dashes (`lr 6e-4`), the value the rest of the line; blank lines and
// comments (from a # at the start of a line or after a space) are skipped. The file's options
// replace the -f in argv, so one getopt_long pass reads everything in order and an option given
// after -f overrides the file's (the last value wins), one given before it is overridden.
#pragma once
#include <getopt.h>

#ifdef __cplusplus
extern "C" {
#endif

// argv with every -f FILE, -fFILE, --config FILE and --config=FILE (or an unambiguous abbreviation
// of --config, as getopt_long takes them) replaced by "--name" "value" pairs from FILE; *argc is
// updated. longs and shorts are the program's getopt_long tables: they say which option takes a
// value (so that a value such as `--prompt -f` is never read as -f) and which names exist; the
// option that reads a file must be {"config", required_argument, 0, 'f'}. Exits naming FILE and the
// line on an unknown option, a missing value, a nested config, or a file that cannot be read.
char** config_expand_argv(int* argc, char** argv, const struct option* longs, const char* shorts);

// "FILE line N" when arg (an element of the expanded argv, e.g. optarg) came from a config file;
// NULL when it came from the command line.
const char* config_origin(const char* arg);

#ifdef __cplusplus
}
#endif
