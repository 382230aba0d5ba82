pub(crate) struct B;

pub(crate) fn make() -> B {
    super::a::a()
}
