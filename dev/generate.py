"""Rewrite what gpuflow generates from its own data (gpuflow.tools.generated): `make generate`. A development step,
not a user command: it writes into the repository."""

from gpuflow.paths import PROJECT_ROOT
from gpuflow.tools.generated import generated_files


def main() -> None:
    for path, text in generated_files().items():
        changed = not path.exists() or path.read_text() != text
        if changed:
            path.write_text(text)
        print(f"{'wrote' if changed else 'current'} {path.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
