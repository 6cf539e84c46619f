"""The tokenizer files an engine carries: what a host needs to turn text into ids and back."""

import shutil

from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir


def test_a_separate_chat_template_travels_with_the_engine(tmp_path, llama_ckpt):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama_ckpt, ckpt)
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (ckpt / "chat_template.jinja").write_text(template)  # where newer transformers save it
    build_engine(ckpt, tmp_path / "engine", spec_build(0), say=lambda _: None)
    engine = load_engine_dir(tmp_path / "engine")  # hashed like every other file
    assert (engine.path / "chat_template.jinja").read_text() == template
    assert "chat_template.jinja" in engine.config.files
