// CRC-32C (Castagnoli), the checksum of our model and state files: it detects every error burst of up
// to 32 bits and, on x86 with SSE 4.2, runs at several GB/s (the crc32 instruction), so that verifying
// a checkpoint costs little next to reading it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The CRC-32C of bytes, continued from crc (0 for the first piece): crc32c(crc32c(0, a), b) is the
// CRC of a followed by b. crc32c(0, "123456789", 9) is 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* bytes, size_t n);

#ifdef __cplusplus
}
#endif
