#!/usr/bin/perl
# tests/gpu/emu/cu2cpp.pl IN OUT — a CUDA source of kernels/cuda/ (.cu, .cuh) as C++17 for the CPU
# emulation (tpk_emu.h); the Makefile writes the copies into $(B)/emu/src, where the .cu files'
# #include "common.cuh" finds the converted headers. Line numbers are kept (#line names the
# original), so compiler messages and __LINE__ point into kernels/cuda/. Rewrites:
#   kernel<targs><<<grid, block, smem, stream>>>(args)
#       -> tpk_emu_launch("kernel<targs>", tpk_emu_cfg(grid, block, smem, stream), [&] { kernel<targs>(args); })
#      (the kernel is called as a C++ function by every emulated thread; its template arguments are
#      deduced from the arguments as nvcc does)
#   extern __shared__ [__align__(n)] T name[];  -> T *name = tpk_emu_dyn_smem<T>();
#   __shared__ [__align__(n)] T name[dims];     -> static T name[dims] (aligned); tpk_emu_shared(name, sizeof name, "name");
#      (the blocks of a launch run one after another, so a function-local static is the block's
#      shared memory; tpk_emu_shared poisons it when the block's first thread gets there and makes
#      it known to the race detector)
#   [template <P1 a, P2 b>] __global__ void kernel(params) {
#       -> the same, then tpk_emu_kernel_enter((const void *)&kernel<a, b>); as the body's first
#      statement, on the same line (the launch's checks against the kernel's attributes; the
#      thread's accesses are the kernel's from there on)
# Fails when a launch or a __shared__ declaration is left that it did not understand.
use strict;
use warnings;

my ($in, $out, $name) = @ARGV;
die "usage: cu2cpp.pl IN OUT [NAME]\n" unless defined $out;
$name = $in unless defined $name;
open(my $fh, '<', $in) or die "cu2cpp.pl: $in: $!\n";
my $s = do { local $/; <$fh> };
close $fh;

my $launches = 0;
# the kernel: a name with optional template arguments (no nested <>), then (after any spaces or
# line breaks) <<< ... >>> and the argument list (balanced parentheses, any number of lines)
$s =~ s{\b([A-Za-z_]\w*(?:<[^<>;{}\n]*>)?)\s*<<<(.*?)>>>(\s*)(?<args>\((?:[^()]++|(?&args))*\))}{
    $launches++;
    "tpk_emu_launch(\"$1\", tpk_emu_cfg($2),$3\[&] { $1$+{args}; })"
}gse;

# dynamic shared memory
$s =~ s{\bextern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+(\w+)\s*\[\s*\]\s*;}{$1 *$2 = tpk_emu_dyn_smem<$1>();}g;
# static shared arrays
my $dims = qr/(?:\s*\[[^\]\n]+\])+/;
$s =~ s{\b__shared__\s+(?:__align__\(\s*(\d+)\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+$dims(?:\s*,\s*\w+$dims)*)\s*;}{
    my ($al, $type, $list) = ($1 // 16, $2, $3);
    join(" ", map { /^(\w+)/; "static $type $_ __attribute__((aligned($al))); tpk_emu_shared($1, sizeof $1, \"$1\");" } split(/\s*,\s*/, $list))
}ge;

# kernel definitions: the entry hook, with the address of the kernel (its template parameters'
# names as the arguments: the specialization that runs)
my $kernels = 0;
$s =~ s{((?:\btemplate\s*<(?<tp>[^<>;{}]*)>\s*)?(?:static\s+)?\b__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s+)?(?<name>\w+)\s*(?<params>\((?:[^()]++|(?&params))*\))\s*\{)}{
    my ($all, $name) = ($1, $+{name});
    my $targs = '';
    if (defined $+{tp}) {
        my @names = map { s/\s*=.*//s; /(\w+)\s*$/ ? $1 : die "cu2cpp.pl: $in: template parameter '$_' of $name\n" } split(/,/, $+{tp});
        $targs = '<' . join(', ', @names) . '>';
    }
    $kernels++;
    "$all tpk_emu_kernel_enter((const void *)&$name$targs);"
}gse;

# what is left would not compile or not run as a kernel (the flash hooks' __shared__ stands in a
# branch the emulation does not compile: #ifndef TPK_FLASH_EMU)
my $rest = $s;
$rest =~ s{#ifndef TPK_FLASH_EMU\n.*?\n#endif\n}{}s;
$rest =~ s{//[^\n]*|/\*.*?\*/}{}gs;
die "cu2cpp.pl: $in: a kernel launch left unconverted\n" if $rest =~ /<<<|>>>/;
die "cu2cpp.pl: $in: a __shared__ declaration left unconverted\n" if $rest =~ /\b__shared__\b/;
my $globals = () = $rest =~ /\b__global__\b/g;
die "cu2cpp.pl: $in: $globals __global__ functions, $kernels kernel definitions understood\n" if $globals != $kernels;

open(my $oh, '>', $out) or die "cu2cpp.pl: $out: $!\n";
# g++ sees the kernel bodies, which nvcc never hands to the host compiler: -Wextra's "enumerated and
# non-enumerated type in conditional expression" (no flag of its own; `i < n ? i : ENUM` in two
# attention kernels) is off in these files, every other warning stays an error
print $oh "#pragma GCC diagnostic ignored \"-Wextra\"\n#line 1 \"$name\"\n$s";
close $oh;
print STDERR "cu2cpp.pl: $name: $launches kernel launches, $kernels kernels\n" if $ENV{TPK_EMU_VERBOSE};
