/* tpk/base/version.h — the kit's version, the one place it is written.
 *
 * MAJOR.MINOR.PATCH (semantic versioning). The Makefile reads these three lines for tpk.pc,
 * tpk-cuda.pc and the CMake package (tpkConfigVersion.cmake), so a program can ask for a version
 * at build time (pkg-config --atleast-version, find_package(tpk 0.1)) and at run time
 * (tpk_version(): the headers it was compiled with). The policy (README, "Versions and
 * compatibility"): a PATCH release changes no declaration; a MINOR release may add functions,
 * enumerators and fields appended at the end of a descriptor struct (zero: the old behaviour);
 * a MAJOR release may change or remove anything — and before 1.0.0, as semantic versioning
 * allows, a MINOR one may too, each such change listed in its notes. The archives are built from
 * the same tree as the headers: link the archive installed with them. */
#ifndef TPK_VERSION_H
#define TPK_VERSION_H

#define TPK_VERSION_MAJOR 0
#define TPK_VERSION_MINOR 1
#define TPK_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH", made from the three numbers above */
#define TPK__VERSION_STR(x) #x
#define TPK__VERSION_XSTR(x) TPK__VERSION_STR(x)
#define TPK_VERSION_STRING                                                  \
    TPK__VERSION_XSTR(TPK_VERSION_MAJOR)                                    \
    "." TPK__VERSION_XSTR(TPK_VERSION_MINOR) "." TPK__VERSION_XSTR(TPK_VERSION_PATCH)
/* One number that orders versions: MAJOR * 10000 + MINOR * 100 + PATCH (#if TPK_VERSION >= 100) */
#define TPK_VERSION (TPK_VERSION_MAJOR * 10000 + TPK_VERSION_MINOR * 100 + TPK_VERSION_PATCH)

/* The version of the headers this code was compiled with, "MAJOR.MINOR.PATCH". */
static inline const char *tpk_version(void) { return TPK_VERSION_STRING; }

#endif /* TPK_VERSION_H */
