"""`mmspec bench` reads each benchmark's options from its argparse parser."""

from mmspec.cli.bench import args_for


def test_bench_reads_the_options_from_build_parser_without_running_the_script(tmp_path):
    # it ran `script --help` and regex-parsed the text; a script run prints nothing here
    script = tmp_path / "fake_bench.py"
    script.write_text("import argparse\n\n\n"
                      "def build_parser():\n"
                      "    p = argparse.ArgumentParser()\n"
                      "    p.add_argument('--plot', action='store_true', help='not --threads')\n"
                      "    return p\n\n\n"
                      "if __name__ == '__main__':\n"
                      "    raise SystemExit('the script ran')\n")
    assert args_for(script, ["--plot", "--threads", "2"]) == (["--plot"], ["--threads", "2"])
