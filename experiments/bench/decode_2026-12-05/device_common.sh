# Sourced by this folder's device scripts (final_call.sh, main_call.sh, conv32b_call.sh), from the repository
# root on the device machine, with $OUT set by it.
#   unpack_pack PACK LIB: results folder $R; pack extracted to $A (binaries $B); $SYS is ":$A/sys" when the
#     image lacks a host library the binaries need (checked against $A/LIB), else empty; gpu.txt written.
#   pack_results: repository paths replaced, files compressed, $OUT/results.tar.
set -u
unpack_pack() {
  R=$OUT/r; mkdir -p $R
  mkdir -p .device/a && tar -C .device/a -xJf "$1"
  A=$PWD/.device/a; B=$A/bin
  SYS=""; LD_LIBRARY_PATH=$A/$2 ldd $B/replayssm-bench | grep -q "not found" && SYS=":$A/sys"
  nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
}
pack_results() {
  sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.csv $R/*.log 2>/dev/null
  xz -9 -T8 $R/*.txt $R/*.csv $R/*.log 2>/dev/null; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
}
